"""The disk tier's writes wait while a newcomer's first token is on its way.

Turning K/V into a file's bytes is the engine thread's work, done in its turn between two
steps: under a flood of distinct long prompts on the bundled model, 10-90 ms a turn, and it
came between a newcomer's arrival and the step that makes its first token. The policy
(`PrefixUse._writes_wait`) and the tier's side of it (`DiskTier.tick(write=False)`), without
an engine or a model."""

from __future__ import annotations

import queue
from collections import deque
from types import SimpleNamespace

import pytest

from radixchat.core.cache.disk.tier import DiskTier
from radixchat.core.engine import prefix_use
from radixchat.core.engine.prefix_use import WRITES_WAIT_S, PrefixUse


class Turn(PrefixUse):
    """An engine turn as `_writes_wait` sees it: the batch's rows and the owners waiting."""

    def __init__(self) -> None:
        self.rows: list[SimpleNamespace] = []
        self.waiting: set[str] = set()

    @property
    def _by_uid(self):
        return dict(enumerate(self.rows))

    @property
    def _fair(self):
        return SimpleNamespace(owners=lambda: set(self.waiting))


def row(owner: str, alone: bool = False, first: float | None = None) -> SimpleNamespace:
    return SimpleNamespace(owner=owner, alone=alone, t_first=first)


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(prefix_use.time, "monotonic", lambda: now[0])
    return now


def test_writes_go_on_while_only_a_busy_owner_waits(clock):
    turn = Turn()
    assert not turn._writes_wait()  # nobody at all
    turn.rows = [row("mallory", first=1.0) for _ in range(32)]
    turn.waiting = {"mallory"}  # more of hers queued behind her own rows
    assert not turn._writes_wait()


def test_writes_wait_for_a_newcomer_until_its_first_token(clock):
    turn = Turn()
    turn.rows = [row("mallory", first=1.0) for _ in range(32)]
    turn.waiting = {"mallory", "alice"}
    assert turn._writes_wait()  # alice waits with no row
    turn.waiting = {"mallory"}
    turn.rows.append(row("alice", alone=True))
    assert turn._writes_wait()  # admitted alone: her first token is the next step's
    turn.rows[-1].t_first = clock[0]
    assert not turn._writes_wait()


def test_writes_wait_no_longer_than_their_bound(clock):
    turn = Turn()
    turn.waiting = {"alice"}
    assert turn._writes_wait()
    clock[0] += WRITES_WAIT_S / 2
    assert turn._writes_wait()
    clock[0] += WRITES_WAIT_S
    assert not turn._writes_wait()  # newcomers without end: the writes go on
    turn.waiting = set()
    assert not turn._writes_wait()
    turn.waiting = {"bob"}
    assert turn._writes_wait()  # a new wait starts its own bound


def test_a_tick_without_writes_keeps_what_waits_and_says_nothing_is_ready():
    tier = DiskTier.__new__(DiskTier)  # the write loop's state only: no folder, no threads
    written: list[object] = []
    tier.todo = deque([("a path's end", False), ("another", True)])
    tier.backlog = 0
    tier._done = queue.Queue()
    tier._drain = lambda: 0
    tier._fit = lambda: None
    tier._write_path = lambda end, keep: written.append(end) or 1 << 20
    assert tier.tick(write=False) is False  # nothing to do at once: no wake-up spin
    assert written == [] and len(tier.todo) == 2
    tier.tick()
    assert written == ["a path's end", "another"] and not tier.todo
