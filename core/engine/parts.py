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

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixchat.core.cache.kv import PrefixStore
    from radixchat.core.cache.scope import CacheScope
    from radixchat.core.config import Settings
    from radixchat.core.engine.active import Active
    from radixchat.core.engine.sched.fairness import FairQueue
    from radixchat.core.engine.sched.owners import OwnerCounts
    from radixchat.core.engine.step.generator import Generator
    from radixchat.core.models.model import LoadedModel


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
    _gen: Generator | None  # the batch generator, once the model has loaded

    def _preempt(self, victims: list[Active]) -> None:  # core.engine.sched.preempt
        raise NotImplementedError

    def _leave_batch_all(self, rows: list[Active]) -> None:  # core.engine.engine
        raise NotImplementedError
