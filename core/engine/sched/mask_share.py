"""Grammar masks paid from their owner's share of a step.

A constrained reply's next-token mask is computed inside every step (one call per owner, on
llguidance's threads while the step's forward runs: core.engine.sample.constrain.masks), and the step
waits for it, so one user's many constrained streams lengthen everyone's steps by what their
masks cost, and take cores the forward needs. What a mask costs depends on the grammar and the
vocabulary: on SmolLM2 (49k tokens) a 60 KB schema of heavy `pattern`s measured 0.65 ms a mask
one row at a time, and a grammar llguidance handles slowly costs more. With more than one
owner at work, each owner's masks may take at most their share of a step (the step's model
time split among the owners with work, and never less than `MASK_FLOOR_S`): past it, their
latest constrained rows are preempted (core.engine.sched.preempt: they pause and resume, their
grammar state kept) and their next constrained requests wait, while one of their constrained
rows always runs. Alone, an owner's masks take what they take.

Two margins keep the same rows from bouncing in and out (each bounce is a filter of the batch
and a prefill on resuming, paid by everyone's steps; on a busy machine 300+ a 36 s flood,
many rows preempted one to three steps after they were admitted, over a budget they had
filled to the last millisecond):
- a constrained request is admitted only while its owner's masks stay under `RESUME` of the
  share, and preempted only past the whole share;
- an owner who had work counts among the owners for `LINGER_S` after their last request
  ended, so a user between two turns (reading a reply, typing) keeps the share set aside and
  the other owner's rows are not let in only to be preempted again at the next turn.

A part of `Engine` (a mixin), engine thread only. Uses `_by_uid`, `_fair`.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Hashable, Iterable

from radixchat.core.engine.active import Active
from radixchat.core.engine.parts import EngineParts
from radixchat.core.engine.sched.owners import LINGER_S

MASK_FLOOR_S = 0.02  # per step, what one owner's masks may always take
EMA = 0.2  # weight of the latest step in the step time's moving average
RESUME = 0.8  # of the share: what an owner's masks may come to with a newly admitted row


class MaskShare(EngineParts):
    _model_step_s = 0.0  # the step's time without masks, a moving average
    _lingering: dict[Hashable, float] | None = None  # owner -> when they were last seen with work (monotonic s)

    def _note_step(self, step_s: float, rows: Iterable[Active]) -> None:
        masks = sum(a.constraint.last_s for a in rows if a.constraint is not None)
        model = max(0.0, step_s - masks)
        self._model_step_s = model if not self._model_step_s else (1 - EMA) * self._model_step_s + EMA * model

    def _mask_owners(self) -> int:
        """Owners with work now, and those whose work ended less than `LINGER_S` ago."""
        now = time.monotonic()
        seen = self._lingering if self._lingering is not None else {}
        for owner in self._fair.load:
            seen[owner] = now
        for owner in [o for o, t in seen.items() if now - t > LINGER_S]:
            del seen[owner]
        self._lingering = seen
        return len(seen)

    def _mask_budget(self) -> float | None:
        """Seconds of masks one owner may spend per step (None: no one else is at work)."""
        owners = self._mask_owners()
        return max(MASK_FLOOR_S, self._model_step_s / owners) if owners > 1 else None

    def _mask_victims(self, rows: Iterable[Active]) -> list[Active]:
        """The latest constrained rows, among `rows`, of owners whose masks exceed their
        share: the rows to preempt (the caller does, core.engine.sched.plan)."""
        budget = self._mask_budget()
        if budget is None:
            return []
        spent: dict[Hashable, float] = defaultdict(float)
        mine: dict[Hashable, list[Active]] = defaultdict(list)
        victims: list[Active] = []
        for a in rows:
            if a.constraint is not None and a.prefilled:
                spent[a.owner] += a.constraint.avg_s
                mine[a.owner].append(a)
        for owner, s in spent.items():
            rows = sorted(mine[owner], key=lambda a: a.joined)
            while s > budget and len(rows) > 1:
                victim = rows.pop()
                s -= _mask_s(victim)
                victims.append(victim)
        return victims

    def _mask_waits(self, a: Active, picked: list[Active]) -> bool:
        """Must constrained request `a` wait because its owner's masks fill their share?"""
        if a.constraint is None:
            return False
        budget = self._mask_budget()
        if budget is None:
            return False
        mine = [b for b in [*self._by_uid.values(), *picked] if b.owner == a.owner and b.constraint is not None]
        timed = [_mask_s(b) for b in mine if _mask_s(b)]
        if not timed:
            return False  # nothing measured yet: one goes in and is measured
        # rows not measured yet (admitted at this turn or still in prefill) count at the mean:
        # counted as nothing, a whole prefill batch came in on one measured row's room
        guess = sum(timed) / len(timed)
        spent = sum(_mask_s(b) or guess for b in mine)
        return spent + (a.constraint.avg_s or guess) > RESUME * budget


def _mask_s(a: Active) -> float:
    """A row's masks, seconds a step (a moving average; 0 before its first)."""
    return a.constraint.avg_s if a.constraint is not None else 0.0
