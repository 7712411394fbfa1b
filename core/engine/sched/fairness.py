"""Who gets the next free batch slot: a fair queue of waiting requests, per user.

Requests wait here until the running batch has room; then the one whose owner has been
served least goes first (the Virtual Token Counter of "Fairness in Serving Large Language
Models", Sheng et al., OSDI 2024). Each owner's counter grows by the work done for them: a
prompt token computed counts 1, a generated token 2 (decoding holds a batch slot for a
whole step). An owner who had nothing waiting or running is lifted to the lowest counter of
the owners who did, so idle time is not saved up as credit to flood the batch later. Within
one owner, the request with the longest cached prefix first (when the engine says), else first
come first served. A user with 64 requests queued and another with one
thus alternate slots, instead of the one waiting behind all 64.

Pure Python, no MLX: the engine thread owns it (one instance, never shared between threads).
"""

from __future__ import annotations

import enum
import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, Protocol, TypeVar

PROMPT_WEIGHT, GENERATED_WEIGHT = 1.0, 2.0
PREFER_AMONG = 16  # how many of one owner's waiting requests `prefer` is asked about per slot


class Wait(enum.Enum):
    """What `blocked` may answer besides True (these are true too): that the same holds for
    the rest of this pick, so the requests it covers need not be looked at one by one. Only
    for a caller who knows the answer cannot change within the pick: a flood's turn then
    costs a glance, not a walk of the whole queue."""

    OWNER = "this owner's other requests wait too"
    ALL = "every request left waits"


class Waiting(Protocol):
    """What the queue reads of a request (the engine's are core.engine.active.Active)."""

    @property
    def owner(self) -> Hashable: ...

    @property
    def done(self) -> bool: ...


W = TypeVar("W", bound=Waiting)


class FairQueue(Generic[W]):
    def __init__(self) -> None:
        self._waiting: list[tuple[int, W]] = []  # (arrival number, request)
        self._arrivals = itertools.count()
        self.served: dict[Hashable, float] = {}  # owner -> virtual tokens served
        self.load: Counter[Hashable] = Counter()  # owner -> requests waiting or running

    def __len__(self) -> int:
        return len(self._waiting)

    def push(self, a: W) -> None:
        """A new request arrives (it stays counted in `load` until `left`)."""
        if self.load[a.owner] == 0:  # back from idle: no credit for the time away
            busy = [self.served.get(o, 0.0) for o, n in self.load.items() if n > 0]
            self.served[a.owner] = max(self.served.get(a.owner, 0.0), min(busy, default=0.0))
        self.load[a.owner] += 1
        self._waiting.append((next(self._arrivals), a))

    def requeue(self, a: W) -> None:
        """A running request goes back to waiting (preempted): still counted in `load`, and
        first among its owner's requests."""
        self._waiting.insert(0, (next(self._arrivals), a))

    def owners(self) -> set[Hashable]:
        """The owners with a request waiting."""
        return {a.owner for _, a in self._waiting if not a.done}

    def head(self) -> W | None:
        """The request `pick` would consider first: the least-served owner's earliest."""
        left = [a for _, a in self._waiting if not a.done]
        return min(left, key=lambda a: self.served.get(a.owner, 0.0), default=None)

    def pick(
        self,
        slots: int,
        blocked: Callable[[W, list[W]], bool | Wait],
        prefer: Callable[[W], int] | None = None,
    ) -> list[W]:
        """Take up to `slots` requests, least-served owner first; skip (and keep) those for
        which `blocked(request, picked so far)` is true (and the owner's other requests, or
        all, when it says `Wait.OWNER` or `Wait.ALL`). Among that owner's requests (the
        first PREFER_AMONG of them), the one with the largest `prefer` goes first (the
        engine passes the length of its cached prefix, as SGLang's longest-prefix-first
        policy orders its queue), else the earliest.

        The engine asks every turn, and a flood keeps hundreds waiting while the batch is
        full: each request is looked at once a pick (a heap of owners, each owner's requests
        in queue order), not once per slot, and `prefer` asked once per request."""
        self._waiting = [(n, a) for n, a in self._waiting if not a.done]
        if slots <= 0 or not self._waiting:
            return []
        mine: dict[Hashable, list[tuple[int, W]]] = {}  # owner -> (place in the queue, request)
        for place, (_, a) in enumerate(self._waiting):
            mine.setdefault(a.owner, []).append((place, a))
        # the counters move as requests are picked: charge each pick a little so two slots
        # don't both go to one owner only because it was behind by a few tokens
        pending: Counter[Hashable] = Counter()
        # (counter, place of the owner's first request, owner): ties go to the earliest
        turn = [(self.served.get(o, 0.0), q[0][0], o) for o, q in mine.items()]
        heapq.heapify(turn)
        score: dict[int, int] = {}  # prefer's answers, once per request per pick
        picked: list[W] = []
        while len(picked) < slots and turn:
            _, _, owner = heapq.heappop(turn)
            queue, i = mine[owner], 0
            if prefer is not None and len(queue) > 1:
                # fairness chose the owner; the cache chooses which of its requests: one whose
                # prefix is cached costs less prefill, so it starts decoding sooner (an owner
                # with one request waiting has nothing to choose: no tree walk)
                for j, (_, a) in enumerate(queue[:PREFER_AMONG]):
                    if id(a) not in score:
                        score[id(a)] = prefer(a)
                    if score[id(a)] > score[id(queue[i][1])]:
                        i = j
            _, best = queue.pop(i)
            verdict = blocked(best, picked)  # asked once: it waits for this round
            if not verdict:
                picked.append(best)
                pending[owner] += 1
            elif verdict is Wait.ALL:
                break
            elif verdict is Wait.OWNER:
                continue
            if queue:
                heapq.heappush(turn, (self.served.get(owner, 0.0) + pending[owner], queue[0][0], owner))
        taken = {id(a) for a in picked}
        self._waiting = [(n, a) for n, a in self._waiting if id(a) not in taken]
        return picked

    def charge(self, owner: Hashable, prompt_tokens: int = 0, generated_tokens: int = 0) -> None:
        self.served[owner] = (
            self.served.get(owner, 0.0) + PROMPT_WEIGHT * prompt_tokens + GENERATED_WEIGHT * generated_tokens
        )

    def left(self, owner: Hashable) -> None:
        """A request of `owner` ended (finished, failed or cancelled, waiting or running)."""
        self.load[owner] -= 1
        if self.load[owner] <= 0:
            del self.load[owner]

    def clear(self) -> Iterable[W]:
        """Forget every waiting request (the engine fails them); returns them."""
        out = [a for _, a in self._waiting]
        self._waiting = []
        return out
