"""Admission: which waiting requests join the batch at this step, as a policy with no state.

The engine thread calls `choose` once per turn with what it knows (the fair queue, the
running requests, the K/V room, and two questions only the prefix cache can answer); it
gets back the requests to admit, already taken from the fair queue. Nothing here reads or
writes the engine, the generator or the cache, so the policy is tested on plain objects
(tests/test_admission.py) and can be read in one sitting. The fair queue's own order
(least-served owner first, core.engine.sched.fairness) decides whose turn it is; this module
decides how many fit.

The batch is sized by memory: a request is admitted by the K/V the batch's buffers would
take with it (`cost` of the rows and the longest row's `size`, core.engine.sched.preempt: every
row padded to the longest, with a few steps' growth), within `BATCH_SHARE` of the K/V budget (core.cache.batch.layout); when the
batch outgrows it, the engine preempts (core.engine.sched.preempt). Prefill is shared by owner:
the generator prefills what it is handed together, so each owner may have only a share of
the prompts in prefill, and an owner with none there always gets one in at once (the engine
asks the generator to start it in the next step: `BudgetedBatchGenerator.hurry`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable

from radixchat.core.cache.batch.layout import over_cap
from radixchat.core.engine.active import Active
from radixchat.core.engine.sched.fairness import FairQueue, Wait

MIN_SHARED_PREFIX = 64  # tokens of uncached shared prefix worth waiting for


def choose(
    fair: FairQueue[Active],
    running: list[Active],
    *,
    max_batch: int,
    max_prefill_batch: int,
    room: int,
    size: Callable[[Active], int],
    cost: Callable[[int, int], int],
    blocked: Callable[[Active, list[Active]], bool],
    prefer: Callable[[Active], int] | None = None,
) -> list[Active]:
    """Take from `fair` the requests to admit now (least-served owner first).

    `room` is the K/V bytes the batch may hold; `size(a)` the tokens a request's row holds
    (with its growth); `cost(rows, longest)` what `rows` rows set aside when the longest
    holds `longest` (each row is padded to the longest, so one more candidate is weighed in
    O(1)); `blocked(a, picked)` whether `a` must wait beside the `picked` (for a shared
    prefix in prefill, or a read from disk); `prefer(a)` its rank among its owner's
    requests (the longest cached prefix first).

    Equal-length replies started together also end together: a user arriving while one
    other user fills the batch would wait a whole reply for a slot. So an owner with fewer
    running requests than a fair share of `max_batch` (split among the owners with work)
    may join over the cap, up to `over_cap(max_batch)`; the cap then holds the others back
    until the batch is under it again. With the prefill share this is what keeps a
    newcomer's first token within a step or two of an idle server's.
    """
    if not len(fair):
        return []
    # The generator prefills the prompts it holds together: hand it only as many as it
    # prefills at once, and each owner a share of them, so the fair queue also orders
    # prefill (a newcomer would otherwise queue inside the generator behind a flood's prompts).
    prefilling: Counter[Hashable] = Counter(a.owner for a in running if not a.prefilled)
    prefill_share = max(1, max_prefill_batch // max(1, len(fair.load)))
    if prefilling.total() >= max_prefill_batch and all(prefilling[o] for o in fair.owners()):
        return []  # the common turn under a flood: nothing can go in, asked at no cost
    full: list[Active] = []  # a request the room turned away this turn: nobody after it in the fair order goes in
    longest_running = max(map(size, running), default=0)
    seen = _Seen(size)  # the picks so far: admission's two picks hand on one growing list

    def no_room(a: Active, picked: list[Active]) -> Wait | bool:
        # One request alone always runs, however long. And none is passed by the later ones
        # for room: a long conversation (the padding makes it cost as many rows of its
        # length) would otherwise wait as long as short ones keep the batch busy. The batch
        # drains until it fits, as a first-come scheduler's head of line does, and everyone
        # after it waits, asked nothing more; those ahead of it in the fair order go first.
        if full:
            return Wait.ALL
        longest = max(longest_running, seen.of(picked).longest, size(a))
        if cost(len(running) + len(picked) + 1, longest) > room and bool(running or picked):
            full.append(a)
            return Wait.ALL
        return False

    def no_prefill(a: Active, picked: list[Active]) -> bool:
        mine = prefilling[a.owner] + seen.of(picked).owners[a.owner]
        if mine == 0:
            return False  # an owner's first prompt in prefill always goes in
        return mine >= prefill_share or prefilling.total() + len(picked) >= max_prefill_batch

    def wait(a: Active, picked: list[Active]) -> Wait | bool:
        return no_room(a, picked) or no_prefill(a, picked) or blocked(a, picked)

    admit = fair.pick(max_batch - len(running), wait, prefer)
    if not len(fair) or len(running) + len(admit) < max_batch:
        return admit
    mine: Counter[Hashable] = Counter(a.owner for a in running)
    mine.update(a.owner for a in admit)
    share = max(1, max_batch // max(1, len(fair.load)))
    over = _Seen(size)  # this pick's own

    def over_share(a: Active, picked: list[Active]) -> Wait | bool:
        if mine[a.owner] + over.of(picked).owners[a.owner] >= share:
            return Wait.OWNER  # picks only add to it, and nothing else was asked: so for all theirs
        return wait(a, admit + picked)

    return admit + fair.pick(over_cap(max_batch) - len(running) - len(admit), over_share, prefer)


class _Seen:
    """What a pick's list of picked requests adds up to (the longest row, each owner's
    count), folded as it grows: within one `choose` a pick's list only grows (the second
    pick hands on the first's, extended), so each request is read once, not at every
    candidate."""

    def __init__(self, size: Callable[[Active], int]):
        self.size, self.n, self.longest = size, 0, 0
        self.owners: Counter[Hashable] = Counter()

    def of(self, picked: list[Active]) -> _Seen:
        if len(picked) < self.n:  # another list: fold it from its start
            self.n, self.longest, self.owners = 0, 0, Counter()
        for p in picked[self.n :]:
            self.longest = max(self.longest, self.size(p))
            self.owners[p.owner] += 1
        self.n = len(picked)
        return self
