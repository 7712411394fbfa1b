"""The engine's shared state, typed: what its parts (the mixins `Engine` is made of: intake,
the recorder, the prefix cache's glue, preemption, the mask share, emitting) read and write
of one another, declared once (as core.store's `StoreBase` does for the store's parts).

`EngineParts` holds no values and runs nothing: `Engine.__init__` (core.engine.engine) sets
every attribute, and the methods here are the ones one part calls on another, each defined
by the part named beside it. A part that subclasses it is checked by mypy against these
declarations (tests/test_types.py) rather than against attributes listed only in prose.
Threads: as each attribute's comment in `Engine.__init__` says (most engine thread only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import itertools
    import queue
    import threading
    from collections import Counter
    from collections.abc import Callable

    from radixchat.core.cache.kv import PrefixStore
    from radixchat.core.cache.kv_format import KVFormat
    from radixchat.core.cache.radix import Node
    from radixchat.core.cache.scope import CacheScope
    from radixchat.core.config import Settings
    from radixchat.core.engine.active import Active, Command, FinishReason, Templated
    from radixchat.core.engine.output import OutputThread
    from radixchat.core.engine.sample.grammar_cache import CompiledGrammars
    from radixchat.core.engine.sched.fairness import FairQueue
    from radixchat.core.engine.sched.owners import OwnerCounts
    from radixchat.core.engine.sched.plan import Why
    from radixchat.core.engine.shard.lockstep import Link
    from radixchat.core.engine.shard.ops import Op
    from radixchat.core.engine.step.generator import Generator
    from radixchat.core.models.model import LoadedModel
    from radixchat.core.seam.handle import Outbox, RequestHandle
    from radixchat.core.seam.protocol import ModelInfo
    from radixchat.core.seam.requests import ChatRequest, PromptRequest


class EngineParts:
    settings: Settings
    loaded: LoadedModel | None
    steps: int  # engine steps taken
    _active: dict[str, Active]  # every request not finished, by id
    _by_uid: dict[int, Active]  # the batch's rows, by the generator's uid
    _fair: FairQueue[Active]  # requests waiting for a batch slot, per owner
    owners: OwnerCounts
    prefix: PrefixStore | None  # the prefix cache, when on
    scope: CacheScope  # who may reuse what in it
    kv_budget: int  # bytes of K/V the running batch and the prefix cache share
    kv_bytes_per_token: int  # what one more token of one sequence costs
    batch_codes: bool  # the decoding batch holds --kv-bits codes (core.engine.step.coded_attention)
    kv_fmt: KVFormat | None  # the precision K/V is kept at (--kv-bits, --kv-group-size; None: the model's dtype)
    _gen: Generator | None  # the batch generator, once the model has loaded
    # the callers' side and the engine thread (core.engine.intake)
    _info: ModelInfo | None  # what the seam tells of the model, once started
    started_at: float  # when `start` was called (time.time())
    _cmds: queue.SimpleQueue[Command]  # the engine thread's command queue
    _ids: itertools.count[int]  # request ids
    _lock: threading.Lock  # guards _inflight and _arriving (the engine thread takes it too)
    _tok_lock: threading.Lock  # the tokenizer and its chat template, one caller at a time
    _inflight: int  # requests counted and not ended (under _lock)
    _arriving: Counter[str | None]  # owners of the Submits in the command queue (under _lock)
    _grammars: CompiledGrammars  # what users' earlier requests compiled, copied for the next
    _outbox: Outbox  # events for asyncio callers, flushed once per loop turn
    _output: OutputThread  # makes each step's text and events (core.engine.output)
    _ready: threading.Event  # set once the model has loaded (or failed to)
    _stopping: bool  # the engine thread is asked to end
    _closed: bool  # nobody reads _cmds any more
    preemptions: int  # requests sent back to the queue to make room (core.engine.sched.preempt)
    preempted_tokens: int  # tokens they held
    preempted_by: Counter[str]  # preemptions by the policy that chose them (core.engine.sched.plan.Why)
    # the prefix cache's glue (core.engine.prefix_use)
    _forgotten: set[str]  # owners never cached again
    cache_owners: Callable[[str], bool] | None  # whose files the disk tier adopts (None: all)
    _disk_first: bool  # the disk tier (or warm prompts) opens in the engine thread's next turn
    _prefetch: dict[str, Node]  # request id -> node it holds while its prefix is read from disk
    _token_texts: dict[int, str]  # token id -> its text alone, for logprobs (core.engine.emit)
    # rank 0 under mlx.launch (core.engine.shard.recorder)
    link: Link | None  # to the other ranks, when sharded
    _ops: list[Op] | None  # rank 0's changes not yet sent (None: not sharded)
    _busy_since: float  # when the message or step under way began (0: none)
    _digested: list[int] | None  # the tree's counters at the last shape check
    in_step: bool | None  # the last check that every rank's tree and batch agree
    fatal: str | None  # why a sharded server stopped
    on_fatal: Callable[[str], None] | None  # called (any thread) with that reason

    @property
    def alive(self) -> bool:  # core.engine.engine
        raise NotImplementedError

    def submit(self, request: ChatRequest | PromptRequest) -> RequestHandle:  # core.engine.intake
        raise NotImplementedError

    def template(self, request: ChatRequest) -> Templated:  # core.engine.intake
        raise NotImplementedError

    def _close(self, message: str) -> None:  # core.engine.intake
        raise NotImplementedError

    def batch_room(self) -> int:  # core.engine.sched.preempt
        raise NotImplementedError

    def _batch_tokens(self, rows: list[Active], growth: int) -> int:  # core.engine.sched.preempt
        raise NotImplementedError

    def _preempt(self, victims: list[Active], why: Why) -> None:  # core.engine.sched.preempt
        raise NotImplementedError

    def _record(self, op: Op) -> None:  # core.engine.shard.recorder
        raise NotImplementedError

    def _leave_batch_all(self, rows: list[Active]) -> None:  # core.engine.engine
        raise NotImplementedError

    def _finish(  # core.engine.engine; `final`: (caches, tokens) when the generator dropped the row
        self, a: Active, reason: FinishReason, final: tuple[list[Any] | None, list[int]] | None = None
    ) -> None:
        raise NotImplementedError

    def _fail(self, a: Active, message: str) -> None:  # core.engine.engine
        raise NotImplementedError

    def _fail_all(self, message: str) -> None:  # core.engine.engine
        raise NotImplementedError
