"""The inference engine: one thread that owns the model and every MLX operation.

Callers `submit` a ChatRequest from a thread (or `await asubmit` from asyncio, which
templates in a worker thread so the event loop never runs the chat template) and get a
RequestHandle that streams events. Validation and chat templating happen before the
request is queued, so a bad request never reaches the engine. The engine thread drains a
command queue (`Submit`, `Cancel`, `Forget`), then advances mlx-lm's BatchGenerator by one step:
continuous batching, so a new request joins the running batch at the next step and a
finished one leaves it. An error in one request ends that request alone; an error in a
whole batch step fails the requests of that step and the engine goes on with a fresh
generator.

With the prefix cache on, admission restores each prompt's longest cached prefix and
prefills only the rest; a request sharing a long uncached prefix with one being
prefilled waits for it. Prompts are cached when their prefill ends, whole sequences when
they finish; running requests hold a lock on their path.

`Engine` is the orchestrator: its thread's loop, loading, the generator, commands, a
request's way into and out of the batch. Its parts, each a module of its own: the callers'
side and the seam's methods (core.engine.intake.Intake), which requests join the batch
(core.engine.sched.admission, a policy with no state), which running requests pause to make room
(core.engine.sched.preempt.Preempt, core.engine.sched.mask_share.MaskShare for grammar masks), the prefix
cache and disk tier glue (core.engine.prefix_use.PrefixUse), tokens into text events
(core.engine.emit.Emit, made in core.engine.output's thread beside the next step), rank 0's messages under mlx.launch (core.engine.shard.recorder.Recorder).

Left to others: HTTP and the page (webui/), persistence (core/store), the tree and its
K/V (core/cache).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import queue
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, cast

from radixchat.core.cache.scope import CacheScope
from radixchat.core.config import Settings, kv_budget
from radixchat.core.engine.active import Active, Cancel, Command, FinishReason, Forget, Submit, Wake
from radixchat.core.engine.emit import INTERNAL_ERROR, Emit
from radixchat.core.engine.intake import Intake
from radixchat.core.engine.output import OutputThread
from radixchat.core.engine.prefix_use import PrefixUse
from radixchat.core.engine.sample.grammar_cache import CompiledGrammars
from radixchat.core.engine.sched import admission, plan
from radixchat.core.engine.sched.fairness import FairQueue
from radixchat.core.engine.sched.mask_share import MaskShare
from radixchat.core.engine.sched.owners import OwnerCounts
from radixchat.core.engine.sched.plan import TurnPlan, Why
from radixchat.core.engine.sched.preempt import Preempt
from radixchat.core.engine.shard.lockstep import IDLE_TICK_S, LOST, Watchdog, launched
from radixchat.core.engine.shard.ops import Admit, AdmitRow, Fail, Finish, Op, Reserve
from radixchat.core.engine.shard.recorder import Recorder, lost
from radixchat.core.engine.textstream import TextStream
from radixchat.core.platform.memory import MlxMemory, give_back_memory
from radixchat.core.seam.handle import Outbox
from radixchat.core.seam.protocol import ModelInfo
from radixchat.core.seam.requests import Failed, Finished

if TYPE_CHECKING:  # they import MLX, which only the engine thread may load
    from mlx_lm.generate import PromptProcessingBatch

    from radixchat.core.cache.kv import PrefixStore
    from radixchat.core.cache.kv_format import KVFormat
    from radixchat.core.cache.radix import Node
    from radixchat.core.engine.step.generator import Generator
    from radixchat.core.models.model import LoadedModel


log = logging.getLogger("radixchat.engine")


class Engine(Intake, Recorder, PrefixUse, Preempt, MaskShare, Emit):
    def __init__(self, settings: Settings, owners: OwnerCounts | None = None) -> None:
        self.settings = settings
        self.loaded: LoadedModel | None = None  # set by the engine thread before `start` returns
        self._info: ModelInfo | None = None  # what the seam tells of it, once started
        self._cmds: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # guards _inflight and _arriving: the engine thread takes it too
        self._tok_lock = threading.Lock()  # the tokenizer and its chat template, one caller at a time
        self._inflight = 0
        self._arriving: Counter[str | None] = Counter()  # owners of the Submits in the command queue
        self.preempted_by: Counter[str] = Counter()  # engine thread only (core.engine.sched.preempt)
        self._grammars = CompiledGrammars()  # what users' earlier requests compiled, copied for the next
        self._active: dict[str, Active] = {}  # engine thread only
        self._by_uid: dict[int, Active] = {}  # engine thread only
        self._fair = FairQueue()  # engine thread only: requests waiting for a batch slot
        self._forgotten: set[str] = set()  # engine thread only: owners never cached again
        self.cache_owners = None  # (owner) -> bool: whose files the disk tier adopts (None: all)
        # each user's requests, for --max-user-requests: shared by the engines of several models
        self.owners = owners or OwnerCounts()
        self._outbox = Outbox()  # events for asyncio callers, flushed once per loop turn
        self._output = OutputThread(self._outbox)  # makes each step's text and events (core.engine.output)
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._stopping = False
        self._let_go = False  # stop(release=True): let go of the model as the thread ends
        self._closed = False  # nobody reads _cmds any more: the loop has ended (or hangs: _fatal)
        self._thread = threading.Thread(target=self._main, name="radixchat-engine", daemon=True)
        self.steps = 0
        self._step_started = 0.0  # engine thread: when the step under way began
        self.started_at = 0.0
        self.offset_report: dict[str, str] = {}  # core.cache.batch.offset_guard's verdict per cache class
        self.prefix: PrefixStore | None = None  # when the prefix cache is on
        self.scope = CacheScope("all")  # replaced from the settings when the cache is made
        self.kv_budget = 0  # bytes of K/V the running batch and the prefix cache share
        self.kv_bytes_per_token = 0  # what one more token of one sequence costs, measured at start
        self.batch_codes = False  # the decoding batch holds --kv-bits codes (core.engine.step.coded_attention)
        self.kv_fmt: KVFormat | None = None  # the precision K/V is kept at, set at start
        self._token_texts: dict[int, str] = {}  # token id -> its text alone (for logprobs)
        # the prefix cache's disk tier (core.cache.disk.tier) opens in the engine thread's first
        # turn, which this wake-up makes come at once; warm prompts start from there too
        self._prefetch: dict[str, Node] = {}  # request id -> node it holds while its prefix is read from disk
        # under mlx.launch (core.engine.shard.lockstep) rank 0 records what it changes for the others
        self.link = None  # core.engine.shard.lockstep.Link, set by the engine thread when sharded
        self._gen: Generator | None = None  # the batch generator, made by the engine thread once the model loads
        self._sharded = launched() is not None
        self._ops: list[Op] | None = [] if self._sharded else None  # rank 0: not yet sent
        self._busy_since = 0.0  # rank 0: when the message or step under way began (0: none)
        self._digested: list[int] | None = None  # the tree's counters at the last shape check
        self.in_step: bool | None = None  # the last check that every rank's tree and batch agree
        self.fatal: str | None = None  # why a sharded server stopped
        self.on_fatal = None  # called (any thread) with that reason; the CLI stops the server
        self._disk_first = (
            settings.prefix_cache
            and not self._sharded
            and (settings.cache_disk_bytes > 0 or settings.warm_prompts is not None)
        )
        if self._disk_first:
            self._cmds.put(Wake())

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

    def stop(self, release: bool = False) -> None:
        """End whatever is queued or running as cancelled (as Stop does: its text so far kept),
        end the thread and free its MLX streams; with `release`, the thread also lets go of the
        model and the cache's K/V and gives their memory back (a model unloaded while the server
        runs: core.engine.models)."""
        atexit.unregister(self.stop)  # else the registry keeps a stopped engine's model and K/V alive
        if not self._thread.is_alive():
            return
        self._let_go = release
        self._stopping = True
        self._cmds.put(Wake())
        self._thread.join(timeout=30)

    def halt(self) -> None:
        """The server is stopping (core.seam.protocol.Lifecycle): `stop`, the model kept until
        the process ends."""
        self.stop()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self._ready.is_set() and not self._stopping

    # ---- caller side (any thread) ------------------------------------------------------

    # ---- engine thread -----------------------------------------------------------------

    def _main(self) -> None:
        import mlx.core as mx

        from radixchat.core.models.model import load_model

        try:
            try:
                s = self.settings
                from radixchat.core.cache.batch.offset_guard import ensure_offset_semantics

                self.offset_report = ensure_offset_semantics()
                if self._sharded:
                    from radixchat.core.engine.shard.lockstep import start_here

                    self.link, s = start_here(s)
                    self.settings = s
                self.loaded = load_model(s.model, s.dtype, s.context_length, link=self.link)
                from radixchat.core.engine.step import unnormalized

                unnormalized.install()
                unnormalized.use_here(True)
                if s.cpu_ops:
                    from radixchat.core.engine.step import cpu_ops

                    self.cpu_ops = cpu_ops.install(self.loaded.model)
                    cpu_ops.use_here(True)
                from radixchat.core.cache.kv import PrefixStore, kv_bytes_per_token
                from radixchat.core.cache.kv_format import kv_format
                from radixchat.core.cache.rounded import install

                # with one, every plain K/V layer's cache writes at it
                self.kv_fmt = fmt = kv_format(s.kv_bits, s.kv_group_size)
                kv_dtype = install(self.loaded.model, fmt) if fmt is not None else None
                from radixchat.core.engine.step import coded_attention

                slots = s.kv_slots and bool(s.step_tokens) and self.link is None  # (not under mlx.launch yet)
                self.batch_codes = coded_attention.choose(s.kv_batch, fmt, kv_dtype, slots, self.loaded.model)

                self.kv_budget = kv_budget(s)
                if self.link is not None:  # memory may differ between machines: rank 0's counts
                    self.kv_budget = self.link.share(self.kv_budget)
                self.memory = MlxMemory(mx, s, self.kv_budget, self.loaded.vocab_size)  # sets MLX's cache limit
                # the batch's: at codes' size where it holds them
                self.kv_bytes_per_token = kv_bytes_per_token(self.loaded.model, fmt if self.batch_codes else None)
                if s.prefix_cache:
                    self.prefix = PrefixStore(self.loaded.model, self.kv_budget, fmt, kv_dtype)
                    if self.batch_codes:  # (else it measures the batch's rows as it stores the first)
                        self.prefix.bytes_per_token = self.kv_bytes_per_token
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
            self._output.start()
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
            if self._let_go:  # the model and the K/V go now, and their memory back to the system
                self.loaded = self.prefix = None
                give_back_memory(mx.clear_cache)

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
                    self._fatal(LOST if lost(e) else INTERNAL_ERROR)
                    break
                log.exception("engine loop failed; failing its requests and resetting the batch")
                self._fail_all(INTERNAL_ERROR)
                self._gen = self._new_generator()
            finally:
                self._output.send()
        if self.fatal is None:  # a plain stop: what is in flight ends as if Stop were pressed, text kept
            try:
                self._drain_commands(block=False)  # submits already queued are cancelled too
                for rid in list(self._active):
                    self._cmds.put(Cancel(rid))
                self._drain_commands(block=False)
            except Exception:  # what is left fails below
                log.exception("engine stop: cancelling the requests in flight failed")
        self._close(self.fatal or "the engine stopped")
        self._output.stop()
        if watchdog is not None:
            watchdog.stop()
            if self.fatal is None:
                assert self.link is not None  # the watchdog is made only when sharded
                try:
                    self.link.send({"stop": True})
                except RuntimeError:
                    pass

    # ---- sharded (rank 0 of an mlx.launch group; core.engine.shard.lockstep) ----------------------

    def _new_generator(self) -> Generator:
        from mlx_lm.generate import StopSequences

        from radixchat.core.engine.step.stepper import make_generator

        loaded = self.loaded
        assert loaded is not None  # a generator is made once the model has loaded
        # every insert names its stop sequences (eos, or none with ignore_eos)
        self._eos_stops = StopSequences([[t] for t in sorted(loaded.tokenizer.eos_token_ids)])
        self._no_stops = StopSequences()
        # the ranks of a sharded server would have to agree on drafts too: not built
        speculate = 0 if self._sharded else self.settings.speculate
        settings = self.settings
        if self._sharded:  # every rank cuts its chunks alike: not by its own timings
            settings = settings.model_copy(update={"prefill_s": 0.0})
        gen = make_generator(loaded.model, settings, self._mx_stream, self._on_prompt, speculate, self.batch_codes)
        if gen.batch_sampler is not None:  # a row's sampling is its request's
            gen.batch_sampler.request = self._by_uid.get
        if settings.prefill_s:
            gen.newcomer = self._newcomer_waiting
        if not self._sharded:  # (a follower emits no tokens: the ranks would not agree)
            gen.first_due = self._first_token_due
        return gen

    def _first_token_due(self) -> bool:
        """Does the decoding batch owe a first token to a row that is its owner's only one
        (a user's turn prefilled the ordinary way, the engine idle when it came)? Asked by
        the stepper before it gives another newcomer a step of its own, which would hold
        that token back a step (core.engine.step.stepper `_first_alone`)."""
        rows = list(self._by_uid.values())
        owners = Counter(a.owner for a in rows)
        return any(a.prefilled and a.t_first is None and owners[a.owner] == 1 for a in rows)

    def _newcomer_waiting(self) -> bool:
        """Is a request waiting in the command queue whose owner has no row (one that would
        take a step of its own)? Asked by the step in flight, between pieces of its prefill
        (core.engine.step.stepper): the commands are drained between steps, so `_arriving` counts them.
        (Between steps, the prefix cache's disk writes ask of the requests already drained:
        core.engine.prefix_use's `_writes_wait`.)"""
        with self._lock:
            if not self._arriving:
                return False
            owners = list(self._arriving)
        busy = {a.owner for a in self._by_uid.values()}
        return any(o not in busy for o in owners)

    def _drain_commands(self, block: bool) -> None:
        try:  # a sharded rank 0 wakes up to check on the others now and then
            cmd = self._cmds.get(timeout=IDLE_TICK_S if self.link else None) if block else None
        except queue.Empty:
            return
        while True:
            if isinstance(cmd, Submit):
                a = cmd.active
                with self._lock:
                    self._arriving[a.owner] -= 1
                    if self._arriving[a.owner] <= 0:
                        del self._arriving[a.owner]
                if self.prefix is not None:
                    a.key = self.scope.key(a.prompt, a.shared_len, a.owner)
                self._active[a.handle.id] = a
                self._fair.push(a)
            elif isinstance(cmd, Cancel) and cmd.rid in self._active:
                a = self._active[cmd.rid]
                if a.uid is None and a.stream is None:  # not admitted yet: nothing computed, nothing to cache
                    self._release(a)
                    self._output.add(a.handle.push, Finished("", "cancelled", a.usage()))
                else:
                    self._finish(a, "cancelled")
            elif isinstance(cmd, Forget):
                self._forget(cmd.owner, cmd.tokens, cmd.shared_len)
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                break

    def _schedule(self) -> TurnPlan:
        """One scheduler turn (core.engine.sched.plan): preempt what the next step's room and
        the masks' shares need, then what an owner below their share is owed, then fill free
        batch slots from the fair queue (core.engine.sched.admission decides which). Each
        stage is applied before the next reads the batch and the queue."""
        if self.prefix is not None and (self._disk_first or self.prefix.disk is not None):
            self._disk_turn()
        room = self._room_victims()
        gone = {id(a) for a in room}  # (rows compare by identity: Active is a dataclass)
        masks = self._mask_victims(a for a in self._by_uid.values() if id(a) not in gone)
        self._preempt(room, Why.ROOM)
        self._preempt(masks, Why.MASKS)
        preempted = plan.preemptions(room, Why.ROOM) + plan.preemptions(masks, Why.MASKS)
        if not len(self._fair):  # every loop turn comes here: nothing to do most of them
            return TurnPlan(preempted)
        owed = self._owed_victims()
        self._preempt(owed, Why.OWED)
        preempted += plan.preemptions(owed, Why.OWED)
        prefer = None
        if (prefix := self.prefix) is not None:

            def prefer(a: Active) -> int:  # cache-aware: the longest cached prefix first
                # (with the cache on, every request has its key: _drain_commands)
                return prefix.tree.peek(cast("list[int]", a.key)[:-1], self.scope.min_match(a.shared_len))

        admit = admission.choose(
            self._fair,
            list(self._by_uid.values()),
            max_batch=self.settings.max_batch,
            max_prefill_batch=self.settings.max_prefill_batch,
            room=self.batch_room(),
            size=self._row_size,
            cost=self._cost,
            blocked=lambda a, p: self._should_wait(a, p) or self._mask_waits(a, p) or self._disk_wait(a),
            prefer=prefer,
        )
        return TurnPlan(preempted, tuple(self._admit(admit)) if admit else ())

    def _admit(self, new: list[Active]) -> list[Active]:
        from radixchat.core.engine.sample.sampling import guarded, make_request_sampler

        loaded = self.loaded
        assert loaded is not None  # requests are admitted while the model is loaded
        ok = []
        for a in new:  # one request's bad sampler must not keep the others out
            if a.stream is None:  # (a resumed request keeps its sampler and stream)
                try:
                    a.sampler = guarded(a, make_request_sampler(a.sampling, a.constraint))
                except Exception:
                    log.exception("request %s: no sampler", a.handle.id)
                    self._fail(a, INTERNAL_ERROR)
                    continue
                a.stream = TextStream(loaded.tokenizer.detokenizer, a.sampling.stop)
            ok.append(a)
        if not ok:
            return ok
        prefilling = {b.owner for b in self._by_uid.values() if not b.prefilled}
        busy = {b.owner for b in self._by_uid.values()}
        joining = {a.owner for a in ok}
        for a in ok:  # an owner's first prompt in prefill starts at once (core.engine.sched.admission)
            a.hurry = a.owner not in prefilling
            # a newcomer beside others' work, running or joining in this turn (an idle engine's
            # next turn can admit a flood's rows with it): its first token from a step of its
            # own (core.engine.step.stepper)
            a.alone = a.hurry and a.owner not in busy and bool(busy | (joining - {a.owner}))
            prefilling.add(a.owner)
            busy.add(a.owner)
        self._insert(ok, [a.sampler for a in ok])
        for a in ok:
            a.joined = self.steps
            self._fair.charge(a.owner, prompt_tokens=len(a.tokens) - a.hit)
        # what a follower needs to insert the same rows (core.engine.shard.ops.AdmitRow's fields, in order;
        # each has its uid: _insert gave it)
        rows = [(cast(int, a.uid), a.tokens, a.shared_len, a.owner, a.boundaries, a.hit, a.tokens_left) for a in ok]
        self._record(Admit([AdmitRow(*r, a.sampling.ignore_eos, a.hurry, a.alone) for r, a in zip(rows, ok)]))
        return ok

    def _insert(self, rows: list[Active], samplers: list[object | None]) -> None:
        """Restore each request's cached prefix (its path locked) and give the generator the
        rest of its prompt: rank 0's admissions and a follower's replay of them alike."""
        from radixchat.core.engine.sample.sampling import processors

        gen = cast("Generator", self._gen)  # (made before the loop runs: None only once it has ended)
        prompts: list[list[list[int]]] = []
        caches: list[list[Any] | None] = []
        prefixes: list[list[int]] = []
        for a in rows:
            restored, tokens = None, a.tokens
            if self.prefix is not None:
                # (with the cache on, every request has its key: _drain_commands)
                a.match, restored = self.prefix.lookup(cast("list[int]", a.key), self.scope.min_match(a.shared_len))
                a.hit = a.match.length
                a.cached = a.cached if a.preempted else a.hit  # the client's figure: its first admission's
                self._unprefetch(a)  # its own lock holds the path now
            cuts = [a.hit] + [b for b in a.boundaries if a.hit < b < len(tokens)]
            prompts.append([tokens[i:j] for i, j in zip(cuts, cuts[1:] + [len(tokens)])])
            caches.append(restored)
            prefixes.append(tokens[: a.hit])
        # segments make the generator pause at message ends, so snapshots can be taken there
        stops = [self._no_stops if a.sampling.ignore_eos else self._eos_stops for a in rows]
        batched = gen.batch_sampler is not None
        samplers = [None] * len(rows) if batched else samplers  # it asks for each row's (_new_generator)
        uids = gen.insert_segments(
            prompts,
            max_tokens=[a.tokens_left for a in rows],
            caches=caches,
            all_tokens=prefixes,
            samplers=samplers,
            logits_processors=[processors(a, batched) for a in rows],
            stop_sequences=stops,
        )
        for a, uid in zip(rows, uids):
            a.uid = uid
            self._by_uid[uid] = a
        gen.hurry([u for a, u in zip(rows, uids) if a.hurry], alone=[u for a, u in zip(rows, uids) if a.alone])

    def _step(self) -> None:
        self._step_started = time.perf_counter()  # a request's queue time ends where its prefill begins
        # (both are made before the loop runs; _gen is None only once it has ended)
        prompt_resps, gen_resps = cast("Generator", self._gen).next()
        self.steps += 1
        now = time.perf_counter()
        self._note_step(now - self._step_started, self._by_uid.values())
        cast(MlxMemory, self.memory).sample()
        self._on_prompt(prompt_resps)  # the budgeted generator calls it inside its step
        self._on_tokens(gen_resps, now)

    def _on_prompt(self, responses: list[PromptProcessingBatch.Response]) -> None:
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
                for caches, tokens in cast("Generator", self._gen).extract_cache([r.uid]).values():  # (as in _step)
                    self._store(a, tokens, caches)

    def _finish(self, a: Active, reason: FinishReason, final: tuple[list[Any] | None, list[int]] | None = None) -> None:
        """End a request: leave the batch, cache what it computed, flush text, send Finished.

        `final` is (caches, tokens) when the generator already removed the sequence.
        """
        self._leave_batch(a, final)
        self._release(a)  # before the reply ends, so a client that saw it sees the slot free
        self._output.add(self._end_out, a, reason, a.usage())

    def _leave_batch(self, a: Active, final: tuple[list[Any] | None, list[int]] | None = None) -> None:
        """Take `a` out of the generator (unless `final`, its (caches, tokens), says it is out
        already), cache what it computed and tell the other ranks: a finished request's way
        out, and a preempted one's (core.engine.sched.preempt)."""
        if final is None and a.uid is not None:
            gen = cast("Generator", self._gen)  # (as in _step)
            final = gen.remove([a.uid], return_prompt_caches=self.prefix is not None).get(a.uid)
        self._left_batch(a, final)

    def _leave_batch_all(self, rows: list[Active]) -> None:
        """`_leave_batch` for several rows, out of the generator in one call (one filter)."""
        gen = cast("Generator", self._gen)  # (as in _step)
        uids = cast("list[int]", [a.uid for a in rows])  # rows of the batch: each has its uid
        finals = gen.remove(uids, return_prompt_caches=self.prefix is not None)
        for a in rows:
            self._left_batch(a, finals.get(a.uid))

    def _left_batch(self, a: Active, final: tuple[list[Any] | None, list[int]] | None) -> None:
        live = None
        if final is not None and final[0] is not None:
            live = self._store(a, final[1], final[0])
        if a.uid is not None:
            self._record(Finish(a.uid, live))

    def _fail(self, a: Active, message: str) -> None:
        if a.uid is not None:
            cast("Generator", self._gen).remove([a.uid])  # (as in _step)
            self._record(Fail(a.uid))
        self._release(a)
        self._output.add(a.handle.push, Failed(message=message, usage=a.usage()))

    def _release(self, a: Active) -> None:
        """Forget a request that has left the batch, and drop its prefix-cache lock (once)."""
        if a.done:  # e.g. _finish released it, then flushing its text raised and _fail came
            return
        a.done = True
        self._active.pop(a.handle.id, None)
        if a.uid is not None:  # (never admitted: not in the batch)
            self._by_uid.pop(a.uid, None)
        self._fair.left(a.owner)
        if self.prefix is not None:
            self._unprefetch(a)
            self.prefix.release(a.match)
            a.match = None
            if not self._active:
                self.prefix.reserve(0)
                self._record(Reserve(0))
        self._give_slot(a.owner)

    def _fail_all(self, message: str) -> None:
        """Fail every admitted or deferred request (engine thread)."""
        for a in list(self._active.values()):
            self._release(a)
            self._output.add(a.handle.push, Failed(message=message, usage=a.usage()))
        self._by_uid.clear()
        self._fair.clear()
