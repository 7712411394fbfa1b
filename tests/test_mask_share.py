"""Grammar masks paid from their owner's share (core.engine.sched.mask_share), as a pure policy: the
engine's parts it uses stood in by plain objects, the masks' times drawn with a fixed seed."""

from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace

import pytest

from radixchat.core.engine.sched import mask_share
from radixchat.core.engine.sched.mask_share import MaskShare


class Share(MaskShare):
    """MaskShare with what it uses of the engine: the batch and the fair queue's load."""

    def __init__(self, model_step_s: float):
        self._model_step_s = model_step_s
        self._by_uid: dict[int, SimpleNamespace] = {}
        self._fair = SimpleNamespace(load=Counter())
        self.preempted: list[SimpleNamespace] = []
        self.steps = 0

    def _mask_share(self):
        """A turn of the engine's (Engine._schedule): the policy's victims preempted."""
        victims = self._mask_victims(self._by_uid.values())
        for a in victims:
            del self._by_uid[a.uid]
        self.preempted += victims


def row(uid: int, owner: str, mask_s: float, joined: int) -> SimpleNamespace:
    return SimpleNamespace(
        uid=uid, owner=owner, prefilled=True, joined=joined, constraint=SimpleNamespace(avg_s=mask_s)
    )


def run(share: Share, rng: random.Random, steps: int, waiting: int) -> None:
    """mallory keeps `waiting` constrained requests queued (each ~1 ms a mask) and alice one plain
    row: every step admits what the share lets in, one at a time as admission.choose asks,
    then the masks' times wobble by a few percent (as measured ones do) and the share is kept."""
    share._fair.load.update({"alice": 1, "mallory": waiting})
    queue = [row(uid, "mallory", 0.001, 0) for uid in range(waiting)]
    for _ in range(steps):
        share.steps += 1
        while queue and not share._mask_waits(queue[0], []):
            a = queue.pop(0)
            a.joined = share.steps
            share._by_uid[a.uid] = a
        for a in share._by_uid.values():
            a.constraint.avg_s = 0.001 * rng.uniform(0.95, 1.05)
        before = len(share.preempted)
        share._mask_share()
        queue[:0] = share.preempted[before:]  # back at the head of her queue


def test_rows_admitted_at_the_edge_of_a_share_are_not_preempted_by_its_wobble():
    """The budget is 20 ms a step (two owners, 40 ms of model time) and each of mallory's masks
    ~1 ms: she keeps about 16-20 rows, and keeps the same ones. Without the margin between
    admitting and preempting, the row admitted last was preempted the next time the masks'
    times rose a little, and admitted again, over and over (on a busy machine, 300+
    preemptions in a 36 s flood)."""
    share = Share(model_step_s=0.04)
    run(share, random.Random(0), steps=300, waiting=32)
    running = sum(a.owner == "mallory" for a in share._by_uid.values())
    assert 12 <= running <= 20, running
    assert len(share.preempted) <= 2, len(share.preempted)


def test_the_share_still_holds_past_the_margin():
    """The margin admits less; it does not stop preemption: rows whose masks grow past the share
    are still sent back, the latest admitted first, one of them always left running."""
    share = Share(model_step_s=0.04)
    share._fair.load.update({"alice": 1, "mallory": 8})
    for uid in range(8):
        share._by_uid[uid] = row(uid, "mallory", 0.004, joined=uid)
    share._mask_share()  # 32 ms of masks against a 20 ms share: three go
    assert sorted(a.uid for a in share.preempted) == [5, 6, 7]
    for a in share._by_uid.values():
        a.constraint.avg_s = 0.05  # each alone past the share
    share._mask_share()
    assert list(share._by_uid) == [0]


def test_an_owner_between_two_turns_keeps_the_share_set_aside(monkeypatch):
    """alice's reply ends and she types the next message: for LINGER_S her share stays, so
    mallory's rows are not let in only to be preempted at alice's next turn; after it, mallory
    alone is not limited."""
    clock = [100.0]
    monkeypatch.setattr(mask_share.time, "monotonic", lambda: clock[0])
    share = Share(model_step_s=0.04)
    share._fair.load.update({"alice": 1, "mallory": 4})
    assert share._mask_budget() == pytest.approx(0.02)
    del share._fair.load["alice"]  # her request ended
    clock[0] += mask_share.LINGER_S / 2
    assert share._mask_budget() == pytest.approx(0.02)
    clock[0] += mask_share.LINGER_S
    assert share._mask_budget() is None


def test_rows_not_measured_yet_count_at_the_mean():
    """Requests admitted at one turn (or still in prefill) have no mask time of their own yet:
    they count at the mean of their owner's measured ones, so one turn cannot let in a whole
    prefill batch on the room of one row (which the share then preempted a few steps later)."""
    share = Share(model_step_s=0.04)  # two owners: 20 ms each, new rows up to RESUME of it
    share._fair.load.update({"alice": 1, "mallory": 20})
    for uid in range(10):
        share._by_uid[uid] = row(uid, "mallory", 0.001, joined=0)
    picked = []
    for uid in range(10, 20):
        a = row(uid, "mallory", 0.0, joined=0)
        if not share._mask_waits(a, picked):
            picked.append(a)
    room = mask_share.RESUME * 0.02 / 0.001 - 10  # rows of 1 ms in the margin, beside the 10
    assert room - 1 <= len(picked) <= room, len(picked)
