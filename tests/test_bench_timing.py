"""What the fairness benchmark times is the server's latency, not its own process's pauses."""

from __future__ import annotations

import gc
import random
from types import SimpleNamespace

from loadtests import bench_fairness


def test_alices_turns_are_timed_with_the_benchmarks_collector_off(monkeypatch):
    """A full collection of the benchmark's heap (60-160 ms on two busy cores) that fell inside
    a timed turn was counted as the server's first-token time; during a turn the collector is
    off, and on again between turns (and after a turn that raised)."""
    seen: list[bool] = []

    def turn(http, messages, max_tokens, cap):
        seen.append(gc.isenabled())
        if len(seen) == 2:
            raise RuntimeError("the second turn fails")
        return {"ttft": 0.01}

    monkeypatch.setattr(bench_fairness, "b_turn", turn)
    monkeypatch.setattr(bench_fairness.time, "sleep", lambda s: None)
    args = SimpleNamespace(turns=3, duration=60.0, max_tokens=4, think=0.0)
    between: list[bool] = []
    assert gc.isenabled()
    try:
        bench_fairness.b_turns(None, "alone", args, random.Random(0), on_think=lambda: between.append(gc.isenabled()))
    except RuntimeError:
        pass
    assert seen == [False, False]
    assert between == [True]
    assert gc.isenabled()
