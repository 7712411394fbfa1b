"""The engine's side that callers run: the seam's methods (core.engine.seam.EngineClient).

`Intake` is a part of `Engine` (a mixin, as SGLang's scheduler is made of mixins): it
checks, templates and queues requests, tokenizes, cancels, and reads `stats` and `info`.
Any thread runs it: HTTP's event loop (through `asubmit`, which templates and compiles
grammars in worker threads), Gradio's workers, the CLI. It never takes the engine thread's
place: everything it hands over goes through the command queue (`Submit`, `Cancel`), and
the only state it shares with the engine thread is the in-flight counters under
`self._lock`. The tokenizer has a lock of its own (`self._tok_lock`), never the one the
engine thread takes to free a slot. No MLX here beyond what the tokenizer and the
grammar compiler do.

Uses of the engine's fields: `settings`, `loaded`, `prefix` (whether the model is hybrid,
whether the cache is on, its figures), `link`, `in_step`, `steps`, `started_at`,
`kv_budget`, `kv_bytes_per_token`, `batch_room`, `alive`, `_gen` (its speculator's
counters), `_cmds`, `_outbox`, `_lock`, `_tok_lock`, `_inflight`, `_owner_inflight`,
`_ids`, `_by_uid` (its length), `_ready`, `_stopping`, `_closed`, `_info`, `_fail_queued`.
"""

from __future__ import annotations

import asyncio
import time

from radixchat.core.engine.active import Active, Cancel, Submit, Templated
from radixchat.core.engine.handle import RequestHandle
from radixchat.core.engine.requests import ChatRequest, PromptRequest, QueueFull, RequestError, Sampling
from radixchat.core.engine.seam import (
    DiskCacheStats,
    EngineStats,
    ModelInfo,
    PrefixCacheStats,
    ShardStats,
    SpeculationStats,
)


class Intake:
    @property
    def info(self) -> ModelInfo:
        """The served model (core.engine.seam): fixed once `start` has returned."""
        if self._info is None:
            raise RequestError("the engine is not running", 503, "engine_unavailable")
        return self._info

    def _describe(self) -> ModelInfo:
        m, link = self.loaded, self.link
        sharded = ""
        if link is not None:
            sharded = f"sharded over {link.size} ranks ({link.backend}, {link.sharding} parallel): " + ", ".join(
                f"rank {r.rank} on {r.host} pid {r.pid}" for r in link.ranks
            )
        return ModelInfo(
            model_id=m.model_id,
            num_params=m.num_params,
            dtype=m.dtype,
            context_length=m.context_length,
            vocab_size=m.vocab_size,
            card=m.card,
            tool_format=self.tool_format(),
            notice=m.notice,
            created=int(self.started_at),
            sharded=sharded,
        )

    def stats(self) -> EngineStats:
        """A snapshot for /health, /metrics and the Server tab; safe from any thread (reads only)."""
        bpt = self.kv_bytes_per_token
        running = len(self._by_uid)
        spec = getattr(self._gen, "speculator", None)  # a plain BatchGenerator has none
        link = self.link
        return EngineStats(
            alive=self.alive,
            running=running,
            waiting=max(0, self._inflight - running),
            steps=self.steps,
            max_batch=self.settings.max_batch,
            kv_budget=self.kv_budget,
            kv_bytes_per_token=bpt,
            batch_tokens=self.batch_room() // bpt if bpt else 0,
            prefix_cache=PrefixCacheStats(**self.prefix.tree.summary()) if self.prefix else None,
            disk_cache=DiskCacheStats(**self.prefix.disk.summary()) if self.prefix and self.prefix.disk else None,
            shards=ShardStats(
                size=link.size,
                backend=link.backend,
                sharding=link.sharding,
                in_step=self.in_step,
                messages=link.messages,
                message_bytes=link.sent_bytes,
            )
            if link
            else None,
            speculation=SpeculationStats(**spec.summary()) if spec is not None else None,
        )

    def submit(self, request: ChatRequest | PromptRequest) -> RequestHandle:
        """Validate, template and queue a request. Raises RequestError when refused.

        Templating takes milliseconds to tens of them for a long conversation: from an event
        loop use `asubmit`, which does it in a worker thread."""
        self._check_owner(request.owner)
        if isinstance(request, PromptRequest):
            return self.submit_tokens(self.tokenize(request.prompt), request.sampling, owner=request.owner)
        p = self.template(request)
        return self.submit_tokens(
            p.tokens, request.sampling, p.boundaries, shared_len=p.shared_len, owner=request.owner
        )

    async def asubmit(self, request: ChatRequest) -> RequestHandle:
        """`submit` for asyncio callers: the template and any grammar are built in a worker
        thread, and the handle delivers its events to the calling loop."""
        self._check_owner(request.owner)  # a flood's refusals cost no templating
        constraint = (
            await asyncio.to_thread(self.constraint, request.sampling) if request.sampling.constrained else None
        )
        if isinstance(request, PromptRequest):
            tokens = await asyncio.to_thread(self.tokenize, request.prompt)
            return self.submit_tokens(tokens, request.sampling, owner=request.owner, constraint=constraint)
        p = await asyncio.to_thread(self.template, request)
        return self.submit_tokens(
            p.tokens,
            request.sampling,
            p.boundaries,
            shared_len=p.shared_len,
            owner=request.owner,
            constraint=constraint,
        )

    def tokenize(self, text: str) -> list[int]:
        """Plain text's tokens, no chat template. Any thread; never the engine's lock."""
        if self.loaded is None:
            raise RequestError("the engine is not running", 503, "engine_unavailable")
        with self._tok_lock:
            return list(self.loaded.tokenizer.encode(text))

    def template(self, request: ChatRequest) -> Templated:
        """The prompt's tokens, where its system message ends and, for models with
        non-trimmable layers, the message ends where the prefix cache takes snapshots.
        Any thread; never the engine's lock."""
        if not isinstance(request, ChatRequest):
            raise TypeError("submit takes a ChatRequest")
        if self.loaded is None:
            raise RequestError("the engine is not running", 503, "engine_unavailable")
        messages = [m.model_dump(exclude_none=True) for m in request.messages]
        tok = self.loaded.tokenizer
        hybrid = self.prefix is not None and self.prefix.hybrid
        extra = {}
        if request.tools:
            if self.tool_format() is None:
                raise RequestError(
                    "tools: this model's chat template has no tool-call format", code="tools_unsupported"
                )
            extra["tools"] = request.tools
        with self._tok_lock:
            try:
                prompt = list(tok.apply_chat_template(messages, add_generation_prompt=True, **extra))
                # Snapshots pay off where a later prompt continues this one: after a leading
                # system prompt (shared by many conversations) and before the last message
                # (the end of the previous turn). Two templatings, not one per message.
                system = 1 if messages[0]["role"] == "system" and len(messages) > 1 else 0
                wanted = {k for k in (system, len(messages) - 1) if 0 < k < len(messages)} if hybrid else set()
                if system and self.prefix is not None:
                    wanted.add(system)  # the cache's sharing scope needs it too
                ends = {}
                for k in sorted(wanted):
                    head = list(tok.apply_chat_template(messages[:k], **extra))
                    if prompt[: len(head)] == head:
                        ends[k] = len(head)
            except Exception as e:  # a template may reject an order of roles
                raise RequestError(f"the model's chat template rejected these messages: {e}") from e
        boundaries = sorted(ends.values()) if hybrid else []
        return Templated(prompt, boundaries, ends.get(system, 0) if system else 0)

    def submit_tokens(
        self,
        prompt: list[int],
        sampling: Sampling,
        boundaries: list[int] | None = None,
        *,
        shared_len: int = 0,
        owner: str | None = None,
        constraint=None,
    ) -> RequestHandle:
        """Queue an already tokenized prompt (plain completions: no system message, so all
        of it lives in `owner`'s part of the prefix cache)."""
        if not self._ready.is_set() or self._stopping or self._closed:
            raise RequestError("the engine is not running", 503, "engine_unavailable")
        ctx = self.loaded.context_length
        if not prompt:
            raise RequestError("the prompt is empty")
        if len(prompt) >= ctx:
            # OpenAI's wording: clients (litellm, LangChain) recognise an overflow by it
            raise RequestError(
                f"This model's maximum context length is {ctx} tokens. However, your messages "
                f"resulted in {len(prompt)} tokens. Please reduce the length of the messages.",
                413,
                "context_length_exceeded",
            )
        if sampling.top_k > self.loaded.vocab_size:
            raise RequestError(
                f"top_k must be at most the model's vocabulary size ({self.loaded.vocab_size}), got {sampling.top_k}"
            )
        if sampling.logit_bias and max(sampling.logit_bias) >= self.loaded.vocab_size:
            raise RequestError(
                f"logit_bias: token {max(sampling.logit_bias)} is not in the model's "
                f"vocabulary of {self.loaded.vocab_size} tokens"
            )
        if constraint is None and sampling.constrained:
            constraint = self.constraint(sampling)
        max_tokens = min(sampling.max_tokens or self.settings.max_tokens, ctx - len(prompt))
        with self._lock:
            if self._inflight >= self.settings.max_queue:
                raise QueueFull(self._inflight)
            self._check_owner(owner)
            self._inflight += 1
            if owner is not None:
                self._owner_inflight[owner] += 1
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        rid = f"req-{next(self._ids)}"
        handle = RequestHandle(rid, len(prompt), self.cancel, loop, self._outbox)
        self._cmds.put(
            Submit(
                Active(
                    handle,
                    prompt,
                    sampling,
                    max_tokens,
                    time.perf_counter(),
                    boundaries=boundaries or [],
                    shared_len=shared_len,
                    owner=owner,
                    constraint=constraint,
                )
            )
        )
        if self._closed:  # the engine stopped between the check above and the put: nobody
            self._fail_queued("the engine stopped")  # else will answer what is queued now
        return handle

    def tool_format(self) -> str | None:
        """The tool-call family of the model's chat template (core/engine/tools.py), or None."""
        from radixchat.core.engine.tools import family

        return family(getattr(self.loaded.tokenizer, "chat_template", None)) if self.loaded else None

    def constraint(self, sampling: Sampling):
        """The request's grammar, compiled into its matcher in the caller's thread: a bad one
        is refused before it is queued, and however long a user's schema takes to compile
        (llguidance's limits bound it), the engine thread, which every stream waits on,
        never compiles anything."""
        from radixchat.core.engine import constrain

        lark = sampling.lark
        try:
            grammar = constrain.grammar_for(sampling.json_schema) if lark is None else constrain.grammar_of_lark(lark)
            return constrain.Constraint(grammar, self.loaded.tokenizer, self.loaded.vocab_size)
        except constrain.SchemaError as e:
            raise RequestError(
                f"{'response_format' if lark is None else 'tools'}: {e}", code="invalid_schema"
            ) from None

    def _check_owner(self, owner: str | None) -> None:
        """Refuse a request of an owner who has `max_user_requests` waiting or running (a
        read of a counter: callers check before templating, submit_tokens under the lock)."""
        mine = self._owner_inflight[owner] if owner is not None else 0
        if mine >= self.settings.max_user_requests:
            raise RequestError(
                f"you already have {mine} requests waiting or running, the most one "
                "user may have at once: retry when one has finished",
                429,
                "user_limit",
            )

    def cancel(self, rid: str) -> None:
        self._cmds.put(Cancel(rid))
