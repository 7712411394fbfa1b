"""The engine's side that callers run: the seam's methods (core.seam.protocol.EngineClient).

`Intake` is a part of `Engine` (a mixin, as SGLang's scheduler is made of mixins): it
checks, counts, prepares and queues requests, tokenizes, cancels, and reads `stats` and
`info`. Any thread runs it: HTTP's event loop (`asubmit`), Gradio's workers, the CLI. A
request counts against the queue and its owner's `--max-user-requests` from the moment it
arrives, before any work is done for it (after the checks that need only its size,
core.engine.prepare.check_bounds); templating, tokenizing and grammar compiling then run
in core.engine.prepare's pool, shared fairly by owner, never in the caller's thread nor
asyncio's shared executor. It never takes the engine thread's place: everything it hands
over goes through the command queue (`Submit`, `Cancel`), and the only state it shares
with the engine thread is the in-flight counters and the owners of the Submits on their way
(`_arriving`) under `self._lock`. The tokenizer has a
lock of its own (`self._tok_lock`), never the one the engine thread takes to free a slot.
No MLX here beyond what the tokenizer and the grammar compiler do.

Uses of the engine's fields: `settings`, `loaded`, `prefix` (whether the model is hybrid,
whether the cache is on, its figures), `link`, `in_step`, `steps`, `started_at`,
`kv_budget`, `kv_bytes_per_token`, `batch_codes`, `batch_room`, `alive`, `_gen` (its speculator's
counters), `_cmds`, `_outbox`, `_lock`, `_tok_lock`, `_inflight`, `_arriving`, `owners`,
`_ids`, `_by_uid` (its length), `_ready`, `_stopping`, `_closed`, `fatal`, `_info`,
`_fail_all`, `_grammars` (core.engine.sample.grammar_cache).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import queue
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from radixchat.core.engine import prepare
from radixchat.core.engine.active import Active, Cancel, Submit, Templated
from radixchat.core.engine.parts import EngineParts
from radixchat.core.models.catalog import Card
from radixchat.core.platform.memory import MlxMemory, arrays_beyond, batch_geometry
from radixchat.core.seam.handle import RequestHandle
from radixchat.core.seam.protocol import (
    DiskCacheStats,
    EngineStats,
    MlxMemoryStats,
    ModelInfo,
    PrefixCacheStats,
    ShardStats,
    SpeculationStats,
)
from radixchat.core.seam.requests import ChatRequest, Failed, PromptRequest, QueueFull, RequestError, Sampling
from radixchat.core.seam.tools import family, generic_messages

if TYPE_CHECKING:  # it imports MLX
    from radixchat.core.engine.sample.constrain import Constraint


class Intake(EngineParts):
    _prep: prepare.FairPool | None = None  # the preparation pool, made at the first request
    memory: MlxMemory | None = None  # set by the engine thread as it starts

    @property
    def info(self) -> ModelInfo:
        """The served model (core.seam.protocol): fixed once `start` has returned."""
        if self._info is None:
            raise RequestError("the engine is not running", 503, "engine_unavailable")
        return self._info

    def _describe(self) -> ModelInfo:
        m, link = self.loaded, self.link
        assert m is not None  # `start` describes the model it has loaded
        sharded = ""
        if link is not None:
            sharded = f"sharded over {link.size} ranks ({link.backend}, {link.sharding} parallel): " + ", ".join(
                f"rank {r.rank} on {r.host} pid {r.pid}" for r in link.ranks
            )
        card, sampling = m.card, self.settings.sampling_defaults
        if sampling:  # the server's word over the card's (a --models file's, say)
            card = card or Card(name=m.model_id)
            card = dataclasses.replace(card, sampling={**card.sampling, **sampling})
        return ModelInfo(
            model_id=self.settings.served_model_name or m.model_id,
            num_params=m.num_params,
            dtype=m.dtype,
            context_length=m.context_length,
            vocab_size=m.vocab_size,
            card=card,
            tool_format=self.tool_format(),
            thinking_switch="enable_thinking" in (getattr(m.tokenizer, "chat_template", None) or ""),
            notice=m.notice,
            created=int(self.started_at),
            sharded=sharded,
            weights_bytes=m.weights_bytes,
            kv_bits=self.settings.kv_bits,
            kv_batch_codes=self.batch_codes,
            kv_group=self.kv_fmt.group if self.kv_fmt is not None else 0,
        )

    def stats(self) -> EngineStats:
        """A snapshot for /health, /metrics and the Server tab; safe from any thread (reads only)."""
        bpt, prefix = self.kv_bytes_per_token, self.prefix  # (an engine unloading drops its prefix)
        running = len(self._by_uid)
        gen = self._gen  # None while no model is loaded (stats come from any thread)
        spec = gen.speculator if gen is not None else None
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
            preemptions=self.preemptions,
            preemptions_by=dict(self.preempted_by),
            preempted_tokens=self.preempted_tokens,
            prefix_cache=PrefixCacheStats(**prefix.tree.summary()) if prefix else None,
            disk_cache=DiskCacheStats(**prefix.disk.summary()) if prefix and prefix.disk else None,
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
            memory=self._memory_stats(),
        )

    def _memory_stats(self) -> MlxMemoryStats | None:
        """MLX's memory now, and what its arrays may take beyond the K/V budget (the Server
        tab's bound: the engine's to say, from its own batch's geometry)."""
        memory = self.memory
        if memory is None or self.loaded is None:
            return None
        figures = memory.figures()
        batch = batch_geometry(self.settings.max_batch, self.loaded.context_length, self.kv_bytes_per_token)
        return MlxMemoryStats(**figures, beyond=arrays_beyond(self.kv_budget, figures["step_bound"], batch))

    def submit(self, request: ChatRequest | PromptRequest) -> RequestHandle:
        """Check, count, prepare (template or tokenize, compile any grammar) and queue a
        request. Raises RequestError when refused. The caller's thread waits while the
        preparation pool does the work, in turn with other users' (core.engine.prepare)."""
        chars = self._check_bounds(request)
        self._take_slot(request.owner, request.owner_limit)
        try:
            return self._queue_prepared(request, *prepare.wait(self._prepare(request, chars)))
        except BaseException:
            self._give_slot(request.owner)
            raise

    async def asubmit(self, request: ChatRequest | PromptRequest) -> RequestHandle:
        """`submit` for asyncio callers: the loop is free while the request is prepared, and
        the handle delivers its events to the calling loop."""
        chars = self._check_bounds(request)
        self._take_slot(request.owner, request.owner_limit)  # a flood's refusals cost no templating
        try:
            return self._queue_prepared(request, *await prepare.await_all(self._prepare(request, chars)))
        except BaseException:
            self._give_slot(request.owner)  # refused, failed, or its caller gave up
            raise

    async def count_tokens(self, request: ChatRequest) -> int:
        """The prompt tokens `request` would take, its chat template (and tools) applied:
        templated in the preparation pool in its owner's turn, queued nowhere. It counts
        against the queue and its owner's limit while it runs, as a request does: a flood of
        counts is refused at the limit like any other."""
        chars = self._check_bounds(request)
        self._take_slot(request.owner, request.owner_limit)
        try:
            job = self._pool().submit(
                request.owner, self.template, request, serial=True, heavy=prepare.long_text(chars)
            )
            [templated] = await prepare.await_all([job])
        finally:
            self._give_slot(request.owner)
        return len(templated.tokens)

    def _pool(self) -> prepare.FairPool:
        pool = self._prep
        if pool is None:
            with self._lock:  # made once, by whichever caller comes first
                if self._prep is None:
                    # a user's heavy jobs are paced while anyone else, on any model, is at work
                    self._prep = prepare.FairPool(self.settings.prepare_threads, others=self.owners.others_at_work)
                pool = self._prep
        return pool

    def _check_bounds(self, request: ChatRequest | PromptRequest) -> int:
        """What can be refused from sizes alone, before the request counts or costs anything.
        Returns the characters of its text (`prepare.text_chars`), counted once a request."""
        if not isinstance(request, (ChatRequest, PromptRequest)):
            raise TypeError("submit takes a ChatRequest or a PromptRequest")
        if self.loaded is None or not self._ready.is_set() or self._stopping or self._closed:
            raise RequestError("the engine is not running", 503, "engine_unavailable")
        m, chars = self.loaded, prepare.text_chars(request)
        prepare.check_bounds(request, chars, m.context_length, m.max_token_chars, self.settings.max_schema_bytes)
        return chars

    def _prepare(self, request: ChatRequest | PromptRequest, chars: int) -> list[Future[Any]]:
        """Futures of the request's prompt (Templated, or tokens) and of its grammar's matcher
        when it has one, from the preparation pool: the grammar first, so a bad one is refused
        before any templating, and the two may run side by side. `chars`: its text's
        characters (`_check_bounds`)."""
        pool, owner = self._pool(), request.owner
        jobs: list[Future[Any]] = []
        if request.sampling.constrained:
            jobs.append(pool.submit(owner, self.constraint, request.sampling, owner, heavy=True))
        heavy = prepare.long_text(chars)
        if isinstance(request, PromptRequest):  # both hold the tokenizer's lock: serial
            jobs.insert(0, pool.submit(owner, self.tokenize, request.prompt, serial=True, heavy=heavy))
        else:
            jobs.insert(0, pool.submit(owner, self.template, request, serial=True, heavy=heavy))
        return jobs

    def _queue_prepared(
        self,
        request: ChatRequest | PromptRequest,
        prompt: Templated | list[int],
        constraint: Constraint | None = None,
    ) -> RequestHandle:
        if isinstance(prompt, Templated):
            return self._enqueue(
                prompt.tokens,
                request.sampling,
                prompt.boundaries,
                shared_len=prompt.shared_len,
                owner=request.owner,
                constraint=constraint,
            )
        return self._enqueue(prompt, request.sampling, owner=request.owner, constraint=constraint)

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
        # going on from a cut answer: the prompt it was written after, then its text as the
        # model's own tokens (what a template's continue_final_message does, for any template
        # and without its stripping), so the prefix cache still holds most of it
        going_on = messages.pop()["content"] if request.continue_final else None
        tok = self.loaded.tokenizer
        hybrid = self.prefix is not None and self.prefix.hybrid
        extra: dict[str, Any] = {}
        if self.tool_format() == "generic":  # the template knows no tools: described in words
            if request.tools or any(m["role"] == "tool" or m.get("tool_calls") for m in messages):
                messages = generic_messages(messages, request.tools)
        elif request.tools:
            extra["tools"] = request.tools
        if request.thinking is not None:  # Qwen3's switch, as its template names it
            extra["enable_thinking"] = request.thinking
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
                ends: dict[int, int] = {}
                for k in sorted(wanted):
                    head = list(tok.apply_chat_template(messages[:k], **extra))
                    if prompt[: len(head)] == head:
                        ends[k] = len(head)
                if going_on:
                    prompt += tok.encode(going_on, add_special_tokens=False)
            except Exception as e:  # a template may reject an order of roles
                raise RequestError(f"the model's chat template rejected these messages: {e}") from e
        boundaries = sorted(ends.values()) if hybrid else []
        return Templated(prompt, boundaries, ends.get(system, 0) if system else 0)

    def submit_tokens(
        self, prompt: list[int], sampling: Sampling, *args: Any, owner: str | None = None, **kw: Any
    ) -> RequestHandle:
        """Queue an already tokenized prompt (plain completions: no system message, so all
        of it lives in `owner`'s part of the prefix cache); the rest as `_enqueue` takes it."""
        self._take_slot(owner)
        try:
            return self._enqueue(prompt, sampling, *args, owner=owner, **kw)
        except BaseException:
            self._give_slot(owner)
            raise

    def _enqueue(
        self,
        prompt: list[int],
        sampling: Sampling,
        boundaries: list[int] | None = None,
        *,
        shared_len: int = 0,
        owner: str | None = None,
        constraint: Constraint | None = None,
    ) -> RequestHandle:
        """Check a prepared prompt and hand it to the engine thread; its slot is taken (by
        `_take_slot`) and is the caller's to give back if this raises."""
        m = self.loaded  # (None once a released engine's thread has let go of it)
        if m is None or not self._ready.is_set() or self._stopping or self._closed:
            raise RequestError("the engine is not running", 503, "engine_unavailable")
        ctx = m.context_length
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
        if sampling.top_k > m.vocab_size:
            raise RequestError(
                f"top_k: must be at most the model's vocabulary size ({m.vocab_size}), got {sampling.top_k}",
                code="invalid_value",
            )
        if sampling.logit_bias and max(sampling.logit_bias) >= m.vocab_size:
            raise RequestError(
                f"logit_bias: token {max(sampling.logit_bias)} is not in the model's "
                f"vocabulary of {m.vocab_size} tokens",
                code="invalid_value",  # (as the request's own checks of the field say)
            )
        if constraint is None and sampling.constrained:
            constraint = self.constraint(sampling, owner)
        max_tokens = min(sampling.max_tokens or self.settings.max_tokens, ctx - len(prompt))
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        rid = f"req-{next(self._ids)}"
        handle = RequestHandle(rid, len(prompt), self.cancel, loop, self._outbox)
        with self._lock:
            self._arriving[owner] += 1  # until the engine thread takes it (Engine._newcomer_waiting)
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
            self._fail_queued(self.fatal or "the engine stopped")  # else will answer what is queued now
        return handle

    def tool_format(self) -> str | None:
        """The tool-call family of the model's chat template (core/seam/tools.py), "generic"
        for a template without one; None before a model is loaded."""
        if self.loaded is None:
            return None
        return family(getattr(self.loaded.tokenizer, "chat_template", None)) or "generic"

    def constraint(self, sampling: Sampling, owner: str | None = None) -> Constraint:
        """The request's grammar, compiled into its matcher before it is queued (in the
        preparation pool, or submit_tokens's caller's thread): a bad one is refused there,
        and however long a user's schema takes to compile (its size and llguidance's limits
        bound it), the engine thread, which every stream waits on, never compiles anything.
        A grammar `owner` sent before is a copy of the one compiled then (core.engine.sample.grammar_cache)."""
        from radixchat.core.engine.sample import constrain

        lark, m = sampling.lark, self.loaded
        if m is None:
            raise RequestError("the engine is not running", 503, "engine_unavailable")
        # the cache's key and the compile's text: the forced tool call's grammar, or the schema's JSON
        kind, text = ("lark", lark) if lark is not None else ("json", json.dumps(sampling.json_schema))

        def build() -> constrain.Constraint:
            grammar = constrain.grammar_of_lark(text) if kind == "lark" else constrain.grammar_for(text)
            return constrain.Constraint(grammar, m.tokenizer, m.vocab_size)

        source = f"{kind} {text}"
        try:
            return self._grammars.constraint(owner, source, build)
        except constrain.SchemaError as e:
            raise RequestError(
                f"{'response_format' if lark is None else 'tools'}: {e}", code="invalid_schema"
            ) from None

    def _take_slot(self, owner: str | None, limit: int | None = None) -> None:
        """Count a request against the queue and its owner before any work is done for it
        (templating, compiling): a flood is refused at the limit, never after costing the
        cores the batch needs, and what one owner has counted is all it can have in flight:
        `limit` (the user's own, set by an admin) or --max-user-requests.
        Whoever refuses the request later gives the slot back (`_give_slot`); once it is
        queued, the engine thread does, when it ends."""
        with self._lock:
            if self._inflight >= self.settings.max_queue:
                raise QueueFull(self._inflight)
            if owner is not None:  # counted with the owner's requests on every model
                self.owners.take(owner, self.settings.max_user_requests if limit is None else limit)
            self._inflight += 1

    def _give_slot(self, owner: str | None) -> None:
        with self._lock:
            self._inflight -= 1
            if owner is not None:
                self.owners.give(owner)

    def cancel(self, rid: str) -> None:
        self._cmds.put(Cancel(rid))

    def _close(self, message: str) -> None:
        """Nobody will read the command queue again (the loop has ended, or hangs for good: a
        sharded `_fatal`): fail what is admitted and what is queued with `message`; from here
        on a submitter fails what it queued itself (`submit_tokens`)."""
        self._closed = True
        self._fail_all(message)
        self._fail_queued(message)

    def _fail_queued(self, message: str) -> None:
        """Fail the submits still in the command queue. Runs once the engine has stopped,
        in the engine thread or in a submitter that lost the race with the stop: each
        command is taken by one of them only."""
        while True:
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, Submit):
                self._give_slot(cmd.active.owner)
                cmd.active.done = True
                cmd.active.handle.push(Failed(message=message))
                self._outbox.flush()
