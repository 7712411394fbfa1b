"""Grammar masks paid from their owner's share of a step.

A constrained reply's next-token mask is computed inside every step (one call per owner, on
llguidance's threads while the step's forward runs: core.engine.constrain.masks), and the step
waits for it, so one user's many constrained streams lengthen everyone's steps by what their
masks cost, and take cores the forward needs. What a mask costs depends on the grammar and the
vocabulary: on SmolLM2 (49k tokens) a 60 KB schema of heavy `pattern`s measured 0.65 ms a mask
one row at a time, and a grammar llguidance handles slowly costs more. With more than one
owner at work, each owner's masks may take at most their share of a step (the step's model
time split among the owners with work, and never less than `MASK_FLOOR_S`): past it, their
latest constrained rows are preempted (core.engine.preempt: they pause and resume, their
grammar state kept) and their next constrained requests wait, while one of their constrained
rows always runs. Alone, an owner's masks take what they take.

A part of `Engine` (a mixin), engine thread only. Uses `_by_uid`, `_fair`, `_preempt`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from radixchat.core.engine.active import Active

MASK_FLOOR_S = 0.02  # per step, what one owner's masks may always take
EMA = 0.2  # weight of the latest step in the step time's moving average


class MaskShare:
    _model_step_s = 0.0  # the step's time without masks, a moving average

    def _note_step(self, step_s: float, rows: Iterable[Active]) -> None:
        masks = sum(a.constraint.last_s for a in rows if a.constraint is not None)
        model = max(0.0, step_s - masks)
        self._model_step_s = model if not self._model_step_s else (1 - EMA) * self._model_step_s + EMA * model

    def _mask_budget(self) -> float | None:
        """Seconds of masks one owner may spend per step (None: no one else is at work)."""
        owners = len(self._fair.load)
        return max(MASK_FLOOR_S, self._model_step_s / owners) if owners > 1 else None

    def _mask_share(self) -> None:
        """Preempt the latest constrained rows of owners whose masks exceed their share."""
        budget = self._mask_budget()
        if budget is None:
            return
        spent, mine, victims = Counter(), {}, []
        for a in self._by_uid.values():
            if a.constraint is not None and a.prefilled:
                spent[a.owner] += a.constraint.avg_s
                mine.setdefault(a.owner, []).append(a)
        for owner, s in spent.items():
            rows = sorted(mine[owner], key=lambda a: a.joined)
            while s > budget and len(rows) > 1:
                victim = rows.pop()
                s -= victim.constraint.avg_s
                victims.append(victim)
        self._preempt(victims)

    def _mask_waits(self, a: Active, picked: list[Active]) -> bool:
        """Must constrained request `a` wait because its owner's masks fill their share?"""
        if a.constraint is None:
            return False
        budget = self._mask_budget()
        if budget is None:
            return False
        mine = [b for b in [*self._by_uid.values(), *picked] if b.owner == a.owner and b.constraint is not None]
        timed = [b.constraint.avg_s for b in mine if b.constraint.avg_s]
        if not timed:
            return False  # nothing measured yet: one goes in and is measured
        return sum(timed) + sum(timed) / len(timed) > budget
