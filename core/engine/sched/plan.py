"""What one scheduler turn decides, as a value: the rows it preempts, each with the policy that
chose it, and the requests it admits.

The engine thread builds it each turn (`Engine._schedule`) from the policies, which return
their choices rather than act on them: the room the next step needs and the grammar masks'
shares (core.engine.sched.preempt, core.engine.sched.mask_share), then the room owed to an
owner below their share, then admission (core.engine.sched.admission). The engine applies
each stage before the next is asked, since each reads what the one before left: preempted
rows are back in the fair queue, ahead of their owner's other requests, before the room owed
and admission look at it. Its preemptions' reasons are what the log and the engine's counts
by reason (`EngineStats.preemptions_by`) say. No MLX.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from radixchat.core.engine.active import Active


class Why(enum.Enum):
    """The policy that preempted a row."""

    ROOM = "room"  # the batch would outgrow its K/V room in the next step
    MASKS = "masks"  # its owner's grammar masks outgrew their share of a step
    OWED = "owed"  # a waiting owner below their share of the room needed it


@dataclass(frozen=True)
class Preemption:
    row: Active
    why: Why


@dataclass(frozen=True)
class TurnPlan:
    """One turn's decisions, in the order they were applied."""

    preempted: tuple[Preemption, ...] = ()
    admitted: tuple[Active, ...] = ()


def preemptions(rows: list[Active], why: Why) -> tuple[Preemption, ...]:
    return tuple(Preemption(a, why) for a in rows)
