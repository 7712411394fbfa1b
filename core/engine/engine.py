"""The inference engine: one thread that owns the model and every MLX operation.

Callers `submit` a ChatRequest from a thread (or `await asubmit` from asyncio, which
templates in a worker thread so the event loop never runs the chat template) and get a
RequestHandle that streams events. Validation and chat templating happen before the
request is queued, so a bad request never reaches the engine. The engine thread drains a
command queue (`_Submit`, `_Cancel`), then advances mlx-lm's BatchGenerator by one step:
continuous batching, so a new request joins the running batch at the next step and a
finished one leaves it. An error in one request ends that request alone; an error in a
whole batch step fails the requests of that step and the engine goes on with a fresh
generator.

With the prefix cache on, admission restores each prompt's longest cached prefix and
prefills only the rest; a request sharing a long uncached prefix with one being
prefilled waits for it (see `_should_wait`). Prompts are cached when their prefill ends,
whole sequences when they finish; running requests hold a lock on their path.

Left to others: HTTP and the page (webui/), persistence (core/store), the tree and its
K/V (core/cache).
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from radixchat.core.cache.radix import Match, common_prefix
from radixchat.core.cache.scope import CacheScope
from radixchat.core.config import Settings, kv_budget
from radixchat.core.engine.fairness import FairQueue
from radixchat.core.engine.handle import Outbox, RequestHandle
from radixchat.core.engine.lockstep import IDLE_TICK_S, LOST, Watchdog, counters, launched, shape_digest
from radixchat.core.engine.requests import (
    ChatRequest,
    Failed,
    Finished,
    PromptRequest,
    QueueFull,
    RequestError,
    Sampling,
    TextDelta,
    TokenLogprob,
    Usage,
)
from radixchat.core.engine.seam import (
    DiskCacheStats,
    EngineStats,
    ModelInfo,
    PrefixCacheStats,
    ShardStats,
    SpeculationStats,
)
from radixchat.core.engine.textstream import TextStream

if TYPE_CHECKING:  # both import MLX, which only the engine thread may load
    from radixchat.core.cache.kv import PrefixStore
    from radixchat.core.engine.model import LoadedModel

log = logging.getLogger("radixchat.engine")
MIN_SHARED_PREFIX = 64  # tokens of uncached shared prefix worth waiting for
# What a client reads when its request failed inside the engine: the details (library
# messages, tracebacks) go to the server's log, never to a client
INTERNAL_ERROR = "internal error while generating this reply (the server's log has the details)"


def _lost_or_internal(e: BaseException) -> str:
    """What clients read when a sharded step failed: a lost rank says so, anything else is internal."""
    text = str(e).lower()
    if any(w in text for w in ("peer", "[ring]", "jaccl", "mpi", "socket")):
        return LOST
    return INTERNAL_ERROR


@dataclass
class _Active:
    """Engine-thread state of one request."""

    handle: RequestHandle
    prompt: list[int]
    sampling: Sampling
    max_tokens: int
    t_submit: float
    boundaries: list[int]  # message ends inside the prompt (hybrid models only)
    shared_len: int = 0  # the system message's tokens: the part other users may share
    owner: str | None = None  # whose namespace of the prefix cache holds the rest
    key: list[int] | None = None  # the prompt as the prefix cache keys it (core.cache.scope)
    uid: int | None = None
    stream: TextStream | None = None
    error: BaseException | None = None  # set by a guarded sampler
    generated: int = 0
    t_admitted: float | None = None
    t_first: float | None = None
    t_last: float | None = None
    done: bool = False
    prefilled: bool = False  # its prompt is through prefill (and in the prefix cache, if on)
    match: Match | None = None  # the prefix-cache match this request holds a lock on
    cached: int = 0  # prompt tokens restored from the prefix cache
    constraint: object | None = None  # core.engine.constrain.Constraint: the grammar its reply follows
    logprobs: list = field(default_factory=list)  # TokenLogprob of every generated token (with `logprobs`)
    unsent: list = field(default_factory=list)  # those not yet attached to a delta

    def usage(self) -> Usage:
        now = time.perf_counter()
        start = self.t_admitted or now
        decode_s = (self.t_last - self.t_first) if self.t_first and self.t_last else 0.0
        return Usage(
            prompt_tokens=len(self.prompt),
            cached_tokens=self.cached,
            generated_tokens=self.generated,
            queue_ms=(start - self.t_submit) * 1e3,
            ttft_ms=(self.t_first - self.t_submit) * 1e3 if self.t_first else None,
            total_ms=(now - self.t_submit) * 1e3,
            decode_tps=(self.generated - 1) / decode_s if decode_s > 0 else 0.0,
        )


BATCH_SHARE = 0.75  # of the K/V budget, the most the running batch may set aside


def over_cap(max_batch: int) -> int:
    """The hard batch limit: `max_batch` plus room for users below their fair share."""
    return max_batch + max(1, max_batch // 4)


@dataclass
class Templated:
    """A chat request's prompt as tokens, with the positions the prefix cache cares about."""

    tokens: list[int]
    boundaries: list[int]  # message ends where snapshots are taken (hybrid models only)
    shared_len: int  # where the system message ends (0 without one)


@dataclass
class _Submit:
    """Command: admit a validated, tokenized request."""

    active: _Active


@dataclass
class _Cancel:
    """Command: stop a request (queued or running) at the next step."""

    rid: str


@dataclass
class _Wake:
    """Command: nothing; wakes the engine thread so it sees `_stopping`."""


Command = _Submit | _Cancel | _Wake


class Engine:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.loaded: LoadedModel | None = None  # set by the engine thread before `start` returns
        self._info: ModelInfo | None = None  # what the seam tells of it, once started
        self._cmds: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # guards _inflight only: the engine thread takes it too
        self._tok_lock = threading.Lock()  # the tokenizer and its chat template, one caller at a time
        self._inflight = 0
        self._active: dict[str, _Active] = {}  # engine thread only
        self._by_uid: dict[int, _Active] = {}  # engine thread only
        self._fair = FairQueue()  # engine thread only: requests waiting for a batch slot
        self._owner_inflight: Counter = Counter()  # guarded by _lock: per-owner admission limit
        self._outbox = Outbox()  # events for asyncio callers, flushed once per loop turn
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._stopping = False
        self._closed = False  # the engine thread has left its loop: nobody reads _cmds any more
        self._thread = threading.Thread(target=self._main, name="radixchat-engine", daemon=True)
        self.steps = 0
        self._step_started = 0.0  # engine thread: when the step under way began
        self.started_at = 0.0
        self.offset_report: dict[str, str] = {}  # core.cache.offset_guard's verdict per cache class
        self.prefix: PrefixStore | None = None  # when the prefix cache is on
        self.scope = CacheScope("all")  # replaced from the settings when the cache is made
        self.kv_budget = 0  # bytes of K/V the running batch and the prefix cache share
        self.kv_bytes_per_token = 0  # what one more token of one sequence costs, measured at start
        self._token_texts: dict[int, str] = {}  # token id -> its text alone (for logprobs)
        # the prefix cache's disk tier (core.cache.disk) opens in the engine thread's first
        # turn, which this wake-up makes come at once; warm prompts start from there too
        self._prefetch: dict[str, object] = {}  # request id -> node it holds while its prefix is read from disk
        # under mlx.launch (core.engine.lockstep) rank 0 records what it changes for the others
        self.link = None  # core.engine.lockstep.Link, set by the engine thread when sharded
        self._gen = None  # the batch generator, made by the engine thread once the model loads
        self._sharded = launched() is not None
        self._ops: list[list] | None = [] if self._sharded else None  # rank 0: not yet sent
        self._busy_since = 0.0  # rank 0: when the message or step under way began (0: none)
        self._digested: list | None = None  # the tree's counters at the last shape check
        self.in_step: bool | None = None  # the last check that every rank's tree and batch agree
        self.fatal: str | None = None  # why a sharded server stopped
        self.on_fatal = None  # called (any thread) with that reason; the CLI stops the server
        self._disk_first = (
            settings.prefix_cache
            and not self._sharded
            and (settings.cache_disk_bytes > 0 or settings.warm_prompts is not None)
        )
        if self._disk_first:
            self._cmds.put(_Wake())

    # ---- lifecycle -------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> Engine:
        """Start the engine thread, load the model there, and wait until it is ready."""
        self.started_at = time.time()
        self._thread.start()
        atexit.register(self.stop)
        self._ready.wait(timeout)
        if self._load_error is not None:
            self._thread.join()  # let it release its MLX streams before anyone exits
            raise self._load_error
        if not self._ready.is_set():
            raise TimeoutError("model did not load in time")
        self._info = self._describe()
        return self

    def stop(self) -> None:
        """Fail whatever is queued or running, end the thread and free its MLX streams."""
        atexit.unregister(self.stop)  # else the registry keeps a stopped engine's model and K/V alive
        if not self._thread.is_alive():
            return
        self._stopping = True
        self._cmds.put(_Wake())
        self._thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self._ready.is_set() and not self._stopping

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

    # ---- caller side (any thread) ------------------------------------------------------

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
            _Submit(
                _Active(
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
        self._cmds.put(_Cancel(rid))

    # ---- engine thread -----------------------------------------------------------------

    def _main(self) -> None:
        import mlx.core as mx

        from radixchat.core.engine.model import load_model

        try:
            try:
                s = self.settings
                from radixchat.core.cache.offset_guard import ensure_offset_semantics

                self.offset_report = ensure_offset_semantics()
                from radixchat.core.engine import lockstep

                self.link = lockstep.join("tensor") if self._sharded else None
                if self.link is not None:
                    self.link.hello()
                    s = self.settings = self.link.settings(s)
                    from radixchat.core.engine.catalog import resolve

                    self.link.same_model(resolve(s.model).path)
                    lockstep.install()
                    lockstep.share_tokens_here(self.link)
                self.loaded = load_model(s.model, s.dtype, s.context_length, link=self.link)
                from radixchat.core.engine import unnormalized

                unnormalized.install()
                unnormalized.use_here(True)
                if s.cpu_ops:
                    from radixchat.core.engine import cpu_ops

                    self.cpu_ops = cpu_ops.install(self.loaded.model)
                    cpu_ops.use_here(True)
                from radixchat.core.cache.kv import PrefixStore, kv_bytes_per_token

                self.kv_budget = kv_budget(s)
                if self.link is not None:  # memory may differ between machines: rank 0's counts
                    self.kv_budget = self.link.share(self.kv_budget)
                self.kv_bytes_per_token = kv_bytes_per_token(self.loaded.model)
                if s.prefix_cache:
                    self.prefix = PrefixStore(self.loaded.model, self.kv_budget)
                    self.scope = CacheScope(s.cache_sharing)
                # a stream of this thread's own, so a later engine in the same process
                # never touches one that was cleared (see below)
                self._mx_stream = self.link.stream if self.link else mx.new_stream(mx.default_device())
                self._gen = self._new_generator()
            except BaseException as e:  # reported to start()
                self._load_error = e
                return
            finally:
                self._ready.set()
            self._loop()
        finally:
            self._gen = None
            # A thread that exits while owning MLX streams leaves them to be torn down at
            # process exit, which aborts ("terminate called without an active exception").
            try:
                mx.synchronize()
            except RuntimeError:  # a collective whose peer is gone
                pass
            mx.clear_streams()

    def _loop(self) -> None:
        watchdog = None
        if self.link is not None:
            watchdog = Watchdog(self.settings.shard_timeout_s, lambda: self._busy_since, self._fatal)
        while not self._stopping:
            try:
                self._drain_commands(block=not self._active)
                self._schedule()
                if self._by_uid:
                    if self.link is not None:
                        self._sync(step=True)
                    self._step()
                elif self.link is not None:  # idle: a tick (the others nap), and what is left to send
                    self._sync(step=False)
                self._busy_since = 0.0
            except Exception as e:  # never let the loop die: fail what is running, go on
                if self.link is not None:
                    # the ranks can no longer be known to be in step: the server stops
                    log.exception("sharded engine step failed")
                    self._fatal(_lost_or_internal(e))
                    break
                log.exception("engine loop failed; failing its requests and resetting the batch")
                self._fail_all(INTERNAL_ERROR)
                self._gen = self._new_generator()
            finally:
                self._outbox.flush()
        self._closed = True  # from here on a submitter fails what it queued itself
        self._fail_all(self.fatal or "the engine stopped")
        self._fail_queued(self.fatal or "the engine stopped")
        self._outbox.flush()
        if watchdog is not None:
            watchdog.stop()
            if self.fatal is None:
                try:
                    self.link.send({"stop": True})
                except RuntimeError:
                    pass

    # ---- sharded (rank 0 of an mlx.launch group; core.engine.lockstep) ----------------------

    def _record(self, *op) -> None:
        """Note a change the other ranks must make before the next step (rank 0)."""
        if self._ops is not None:
            self._ops.append(list(op))

    def _sync(self, step: bool) -> None:
        """Send the other ranks what changed and whether a step follows; when the engine is
        idle and the tree changed since the last check, compare its shape across ranks."""
        self._busy_since = time.monotonic()
        tree = self.prefix.tree if self.prefix is not None else None
        now = counters(tree, len(self._by_uid))
        digest = not step and now != self._digested
        ops, self._ops = self._ops, []
        self.link.send({"ops": ops, "step": step, "state": now, "digest": digest, "nap": 0 if step else IDLE_TICK_S})
        if digest:
            digests = self.link.digests(shape_digest(tree, len(self._by_uid)))
            self._digested = now
            self.in_step = len(set(digests)) == 1
            if not self.in_step:
                raise RuntimeError(f"the ranks' prefix caches differ in shape: {digests}")

    def _fatal(self, reason: str) -> None:
        """A sharded server cannot go on (a rank lost or out of step): fail every request
        with `reason`, stop, and let the server exit (any thread: the watchdog's too)."""
        if self.fatal is not None:
            return
        self.fatal = reason
        log.error("radixchat: %s", reason)
        self._stopping = True
        self._fail_all(reason)
        self._outbox.flush()
        if self.on_fatal is not None:
            self.on_fatal(reason)

    def _new_generator(self):
        from mlx_lm.generate import BatchGenerator, StopSequences

        from radixchat.core.engine.stepper import BudgetedBatchGenerator, check_layout

        s = self.settings
        # every insert names its stop sequences (eos, or none with ignore_eos)
        self._eos_stops = StopSequences([[t] for t in sorted(self.loaded.tokenizer.eos_token_ids)])
        self._no_stops = StopSequences()
        kwargs = dict(
            max_tokens=s.max_tokens,
            completion_batch_size=over_cap(s.max_batch),
            prefill_batch_size=s.max_prefill_batch,
            prefill_step_size=s.prefill_step,
            stream=self._mx_stream,
        )
        if s.step_tokens:
            # the ranks of a sharded server would have to agree on drafts too: not built
            gen = BudgetedBatchGenerator(
                self.loaded.model,
                step_tokens=s.step_tokens,
                on_prompt=self._on_prompt,
                slots=s.kv_slots,
                speculate=0 if self._sharded else s.speculate,
                **kwargs,
            )
            if check_layout(gen):
                return gen
            gen.close()
            log.warning(
                "this mlx-lm's BatchGenerator is not the one --step-tokens reorders: "
                "running with its own order (decode, then prefill)"
            )
        return BatchGenerator(self.loaded.model, **kwargs)

    def _drain_commands(self, block: bool) -> None:
        try:  # a sharded rank 0 wakes up to check on the others now and then
            cmd = self._cmds.get(timeout=IDLE_TICK_S if self.link else None) if block else None
        except queue.Empty:
            return
        while True:
            if isinstance(cmd, _Submit):
                a = cmd.active
                if self.prefix is not None:
                    a.key = self.scope.key(a.prompt, a.shared_len, a.owner)
                self._active[a.handle.id] = a
                self._fair.push(a)
            elif isinstance(cmd, _Cancel) and cmd.rid in self._active:
                a = self._active[cmd.rid]
                if a.uid is None:  # not admitted yet: nothing computed, nothing to cache
                    self._release(a)
                    a.handle._push(Finished("", "cancelled", a.usage()))
                else:
                    self._finish(a, "cancelled")
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                break

    def _schedule(self) -> None:
        """Fill free batch slots from the fair queue (least-served owner first).

        Equal-length replies started together also end together: a user arriving while one
        other user fills the batch would wait a whole reply for a slot. So an owner with
        fewer running requests than a fair share of `max_batch` (split among the owners with
        work) may join over the cap, up to `over_cap(max_batch)`; the cap then holds the
        others back until the batch is under it again. Without preemption this is what keeps
        a newcomer's first token within a step or two of an idle server's.
        """
        if self.prefix is not None and (self._disk_first or self.prefix.disk is not None):
            self._disk_turn()
        if not len(self._fair):  # every loop turn comes here: nothing to do most of them
            return
        soft = self.settings.max_batch
        running = len(self._by_uid)
        # The generator prefills the prompts it holds first come first served: hand it only
        # as many as it prefills at once, so the fair queue also orders prefill (a newcomer
        # would otherwise queue inside the generator behind all of a flood's prompts).
        prefill = self.settings.max_prefill_batch - sum(not a.prefilled for a in self._by_uid.values())
        if prefill <= 0:
            return
        room = self.batch_room() - sum(self._need(a) for a in self._by_uid.values())

        def no_room(a: _Active, picked: list[_Active]) -> bool:
            # K/V for the whole reply is set aside at admission (nothing is preempted later);
            # one request alone always runs, however long
            need = self._need(a) + sum(self._need(p) for p in picked)
            return need > room and (running or picked)

        prefer = None
        if self.prefix is not None:

            def prefer(a: _Active) -> int:  # cache-aware: the longest cached prefix first
                return self.prefix.tree.peek(a.key[:-1], self.scope.min_match(a.shared_len))

        admit = self._fair.pick(
            min(soft - running, prefill),
            lambda a, p: no_room(a, p) or self._should_wait(a, p) or self._disk_wait(a),
            prefer,
        )
        if len(self._fair) and running + len(admit) >= soft and len(admit) < prefill:
            mine = Counter(a.owner for a in self._by_uid.values())
            mine.update(a.owner for a in admit)
            share = max(1, soft // max(1, len(self._fair.load)))

            def over_share(a: _Active, picked: list[_Active]) -> bool:
                return (
                    mine[a.owner] + sum(p.owner == a.owner for p in picked) >= share
                    or no_room(a, admit + picked)
                    or self._should_wait(a, admit + picked)
                    or self._disk_wait(a)
                )

            admit += self._fair.pick(min(over_cap(soft) - running, prefill) - len(admit), over_share, prefer)
        if admit:
            self._admit(admit)

    def batch_room(self) -> int:
        """K/V bytes the running batch may hold: most of the budget; the prefix cache keeps
        the rest at least (and evicts its unlocked entries to make room for the batch)."""
        return int(self.kv_budget * BATCH_SHARE)

    def _need(self, a: _Active) -> int:
        return (len(a.prompt) + a.max_tokens) * self.kv_bytes_per_token

    def _should_wait(self, a: _Active, admitting: list[_Active]) -> bool:
        """Should `a` wait for a request that is prefilling a long prefix `a` shares?

        Computing a shared prefix (a system prompt several users send at once) once and
        restoring it beats prefilling it side by side: on a compute-bound device the
        batched prefill costs about the sum of its rows. The wait ends when that request's
        prompt is in the cache (or it ends), at most one prefill later.
        """
        if self.prefix is None:
            return False
        head, least = a.key[:-1], self.scope.min_match(a.shared_len)
        others = [b.key for b in admitting] + [
            b.key for b in self._active.values() if b.uid is not None and not b.prefilled and not b.done
        ]
        shared = max((common_prefix(head, k) for k in others), default=0)
        if shared < least:  # a part of someone else's system message: it would be a miss
            return False
        return shared - self.prefix.tree.peek(head, least) >= MIN_SHARED_PREFIX

    def _admit(self, new: list[_Active]) -> None:
        from radixchat.core.engine.sampling import make_request_sampler

        samplers, ok = [], []
        for a in new:  # one request's bad sampler must not keep the others out
            try:
                sampler = make_request_sampler(a.sampling, a.constraint)
            except Exception:
                log.exception("request %s: no sampler", a.handle.id)
                self._fail(a, INTERNAL_ERROR)
                continue
            ok.append(a)
            a.stream = TextStream(self.loaded.tokenizer.detokenizer, a.sampling.stop)
            samplers.append(self._guard(a, sampler))
        if not ok:
            return
        self._insert(ok, samplers)
        for a in ok:
            self._fair.charge(a.owner, prompt_tokens=len(a.prompt) - a.cached)
        self._record(
            "admit",
            [
                [a.uid, a.prompt, a.shared_len, a.owner, a.boundaries, a.cached, a.max_tokens, a.sampling.ignore_eos]
                for a in ok
            ],
        )

    def _insert(self, rows: list[_Active], samplers: list) -> None:
        """Restore each request's cached prefix (its path locked) and give the generator the
        rest of its prompt: rank 0's admissions and a follower's replay of them alike."""
        prompts, caches, prefixes = [], [], []
        for a in rows:
            restored = None
            if self.prefix is not None:
                a.match, restored = self.prefix.lookup(a.key, self.scope.min_match(a.shared_len))
                a.cached = a.match.length
                self._unprefetch(a)  # its own lock holds the path now
            cuts = [a.cached] + [b for b in a.boundaries if a.cached < b < len(a.prompt)]
            prompts.append([a.prompt[i:j] for i, j in zip(cuts, cuts[1:] + [len(a.prompt)])])
            caches.append(restored)
            prefixes.append(a.prompt[: a.cached])
        # segments make the generator pause at message ends, so snapshots can be taken there
        stops = [self._no_stops if a.sampling.ignore_eos else self._eos_stops for a in rows]
        uids = self._gen.insert_segments(
            prompts,
            max_tokens=[a.max_tokens for a in rows],
            caches=caches,
            all_tokens=prefixes,
            samplers=samplers,
            stop_sequences=stops,
        )
        for a, uid in zip(rows, uids):
            a.uid = uid
            self._by_uid[uid] = a

    @staticmethod
    def _guard(a: _Active, sampler):
        """Wrap a request's sampler so its failure ends that request, not the batch."""
        if sampler is None:
            return None

        def guarded(logprobs):
            import mlx.core as mx

            try:
                return sampler(logprobs)
            except Exception as e:
                a.error = e
                return mx.argmax(logprobs, axis=-1)

        return guarded

    def _step(self) -> None:
        self._step_started = time.perf_counter()  # a request's queue time ends where its prefill begins
        prompt_resps, gen_resps = self._gen.next()
        self.steps += 1
        now = time.perf_counter()
        self._on_prompt(prompt_resps)  # the budgeted generator calls it inside its step
        for r in gen_resps:
            a = self._by_uid.get(r.uid)
            if a is None or a.done:
                continue
            try:
                self._on_token(a, r, now)
            except Exception:
                log.exception("request %s failed", a.handle.id)
                self._fail(a, INTERNAL_ERROR)

    def _on_prompt(self, responses) -> None:
        """Prefill progress: the generator has just computed these prompts' chunks, and
        their caches hold exactly what each response says."""
        for r in responses:
            a = self._by_uid.get(r.uid)
            if a is None:
                continue
            if a.t_admitted is None:
                a.t_admitted = self._step_started
            a.prefilled = a.prefilled or r.end_of_prompt
            if self.prefix is None:
                continue
            # Share a fresh prompt with requests that arrive while this one decodes. A hybrid
            # model also needs a snapshot at every message end and just before the last token.
            if r.end_of_prompt or (r.end_of_segment and self.prefix.hybrid):
                for caches, tokens in self._gen.extract_cache([r.uid]).values():
                    self._store(a, tokens, caches)

    def _on_token(self, a: _Active, r, now: float) -> None:
        token, finish_reason = r.token, r.finish_reason
        if a.error is not None:
            raise a.error
        if a.t_admitted is None:
            a.t_admitted = now
        a.t_first = a.t_first or now
        a.t_last = now
        a.generated += 1
        self._fair.charge(a.owner, generated_tokens=1)
        is_eos = finish_reason == "stop" and token in self.loaded.tokenizer.eos_token_ids
        if not is_eos:
            if a.sampling.logprobs is not None:
                entry = self._token_logprob(token, r.logprobs, a.sampling.logprobs)
                a.logprobs.append(entry)
                a.unsent.append(entry)
            delta = a.stream.add(token)
            if delta:
                a.handle._push(self._delta(a, delta))
        if finish_reason is not None:  # the generator has already dropped it
            self._finish(
                a,
                "stop" if a.stream.stopped or finish_reason == "stop" else "length",
                final=(r.prompt_cache, r.all_tokens),
            )
        elif a.stream.stopped:
            self._finish(a, "stop")

    @staticmethod
    def _delta(a: _Active, text: str) -> TextDelta:
        """Text released by the stream, with the log-probabilities of the tokens behind it."""
        if a.sampling.logprobs is None:
            return TextDelta(text)
        sent, a.unsent = a.unsent, []
        return TextDelta(text, logprobs=sent)

    def _token_logprob(self, token: int, logprobs, top: int) -> TokenLogprob:
        """The chosen token's log-probability and the `top` most likely, from the row's
        logits of this step (core.engine.unnormalized: the step leaves them unnormalized)."""
        import mlx.core as mx

        from radixchat.core.engine.unnormalized import normalized

        logprobs = normalized(logprobs)
        chosen = logprobs[token]
        if top:
            ids = mx.argpartition(-logprobs, kth=top - 1)[:top]
            values = logprobs[ids]
            mx.eval(chosen, ids, values)
            alts = sorted(zip(ids.tolist(), values.tolist()), key=lambda p: -p[1])
        else:
            alts = []
        return TokenLogprob(self._token_text(token), chosen.item(), [(self._token_text(i), v) for i, v in alts])

    def _token_text(self, token: int) -> str:
        text = self._token_texts.get(token)
        if text is None:
            text = self._token_texts[token] = self.loaded.tokenizer.decode([token])
        return text

    def _finish(self, a: _Active, reason: str, final=None) -> None:
        """End a request: leave the batch, cache what it computed, flush text, send Finished.

        `final` is (caches, tokens) when the generator already removed the sequence.
        """
        if final is None and a.uid is not None:
            final = self._gen.remove([a.uid], return_prompt_caches=self.prefix is not None).get(a.uid)
        live = None
        if final is not None and final[0] is not None:
            live = self._store(a, final[1], final[0])
        if a.uid is not None:
            self._record("finish", a.uid, live)
        self._release(a)  # before the reply ends, so a client that saw it sees the slot free
        tail = a.stream.finish()
        if tail or a.unsent:
            a.handle._push(self._delta(a, tail))
        a.handle._push(
            Finished(
                text=a.stream.text,
                finish_reason=reason,
                usage=a.usage(),
                logprobs=a.logprobs if a.sampling.logprobs is not None else None,
            )
        )

    def _fail(self, a: _Active, message: str) -> None:
        if a.uid is not None:
            self._gen.remove([a.uid])
            self._record("fail", a.uid)
        self._release(a)
        a.handle._push(Failed(message=message, usage=a.usage()))

    def _release(self, a: _Active) -> None:
        """Forget a request that has left the batch, and drop its prefix-cache lock (once)."""
        if a.done:  # e.g. _finish released it, then flushing its text raised and _fail came
            return
        a.done = True
        self._active.pop(a.handle.id, None)
        self._by_uid.pop(a.uid, None)
        self._fair.left(a.owner)
        if self.prefix is not None:
            self._unprefetch(a)
            self.prefix.release(a.match)
            a.match = None
            if not self._active:
                self.prefix.tree.reserved = 0
                self._record("reserved", 0)
        with self._lock:
            self._inflight -= 1
            if a.owner is not None:
                self._owner_inflight[a.owner] -= 1

    def _store(self, a: _Active, tokens: list[int], caches, live: int | None = None) -> int | None:
        """Cache a request's tokens; returns the running batch's tokens it counted (which a
        sharded rank 0 sends the others: they count theirs at another moment)."""
        if self.prefix is None:
            return None
        # the running batch shares the budget with the tree; requests still waiting in the
        # fair queue hold no K/V yet
        if live is None:
            live = sum(len(b.prompt) + b.generated for b in self._by_uid.values())
        self.prefix.tree.reserved = live * self.prefix.bytes_per_token
        if self.prefix.disk is not None:  # its files name the owner, not this process's number
            self.prefix.disk.note_owner(self.scope.key([0], 0, a.owner)[0], a.owner)
        self.prefix.store(self.scope.key(list(tokens), a.shared_len, a.owner), caches)
        return live

    def _disk_turn(self) -> None:
        """The disk tier's share of an engine turn (engine thread): open it at the first,
        then write and read back a bounded amount (core.cache.disk.DiskTier.tick)."""
        if self._disk_first:
            self._disk_first = False
            if self.settings.cache_disk_bytes > 0:
                from radixchat.core.cache.disk import open_tier

                cmds = self._cmds  # (the disk threads keep this queue, not the engine)
                try:
                    open_tier(self.settings, self.loaded, self.prefix, self.scope, wake=lambda: cmds.put(_Wake()))
                except Exception:
                    log.exception("the prefix cache's disk tier did not open: memory tier only")
            self._start_warm_up()
        disk = self.prefix.disk
        if disk is None:
            return
        if disk.tick():
            self._cmds.put(_Wake())
        elif not self._by_uid and disk.loading:
            disk.wait_io(0.02)  # nothing decodes: wait for the reader rather than spin

    def _disk_wait(self, a: _Active) -> bool:
        """Must `a` wait while part of its cached prefix is read back from disk? Its path
        stays locked meanwhile, so neither tier evicts what it waits for."""
        disk = self.prefix.disk if self.prefix is not None else None
        if disk is None:
            return False
        m = self.prefix.to_read(a.key, self.scope.min_match(a.shared_len))
        if m is None:
            return False
        held = self._prefetch.get(a.handle.id)
        if held is not m.node:
            self.prefix.tree.lock(m.node)
            if held is not None:
                self.prefix.tree.unlock(held)
            self._prefetch[a.handle.id] = m.node
        disk.want(m.path)
        return True

    def _unprefetch(self, a: _Active) -> None:
        held = self._prefetch.pop(a.handle.id, None)
        if held is not None:
            self.prefix.tree.unlock(held)

    def _start_warm_up(self) -> None:
        """Prefill the system-prompt presets and --warm-prompts in the background, one at a
        time, as requests of an owner no user can be (not stored, not users' metrics)."""
        from radixchat.core.cache.warm import WARM_OWNER, warm_prompts

        s = self.settings
        if s.cache_sharing == "user":  # nothing is shared: a warm prompt would help nobody
            return
        try:
            prompts = warm_prompts(s.warm_prompts, presets=s.warm_presets and s.cache_disk_bytes > 0)
        except (OSError, ValueError) as e:
            log.warning("warm prompts not read: %s", e)
            return

        def run() -> None:
            for text in prompts:
                try:
                    req = ChatRequest(
                        messages=[{"role": "system", "content": text}, {"role": "user", "content": "Hello"}],
                        sampling={"max_tokens": 1, "temperature": 0.0},
                        owner=WARM_OWNER,
                    )
                    self.submit(req).result()
                except RequestError as e:
                    log.info("warm prompt skipped: %s", e)
                    if not self.alive:
                        return
                except Exception:
                    log.exception("warm prompt failed")

        threading.Thread(target=run, name="radixchat-warm-up", daemon=True).start()

    def _fail_all(self, message: str) -> None:
        """Fail every admitted or deferred request (engine thread)."""
        for a in list(self._active.values()):
            self._release(a)
            a.handle._push(Failed(message=message, usage=a.usage()))
        self._by_uid.clear()
        self._fair.clear()

    def _fail_queued(self, message: str) -> None:
        """Fail the submits still in the command queue. Runs once the engine has stopped,
        in the engine thread or in a submitter that lost the race with the stop: each
        command is taken by one of them only."""
        while True:
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, _Submit):
                with self._lock:
                    self._inflight -= 1
                    if cmd.active.owner is not None:
                        self._owner_inflight[cmd.active.owner] -= 1
                cmd.active.done = True
                cmd.active.handle._push(Failed(message=message))
                self._outbox.flush()
