"""What the fairness benchmark times is the server's latency, not its own process's pauses.

The benchmark is run as the repository's scripts are (tests import nothing from loadtests/):
a child Python at the repository root, here with its turn replaced by one that records."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import gc, json, random
from types import SimpleNamespace
from loadtests import bench_fairness as bf

seen, between = [], []

def turn(http, messages, max_tokens, cap):
    seen.append(gc.isenabled())
    if len(seen) == 2:
        raise RuntimeError("the second turn fails")
    return {"ttft": 0.01}

bf.b_turn = turn
bf.time.sleep = lambda s: None
args = SimpleNamespace(turns=3, duration=60.0, max_tokens=4, think=0.0)
before = gc.isenabled()
try:
    bf.b_turns(None, "alone", args, random.Random(0), on_think=lambda: between.append(gc.isenabled()))
except RuntimeError:
    pass
print(json.dumps({"before": before, "seen": seen, "between": between, "after": gc.isenabled()}))
"""


@pytest.mark.slow
def test_alices_turns_are_timed_with_the_benchmarks_collector_off():
    """A full collection of the benchmark's heap (60-160 ms on two busy cores) that fell inside
    a timed turn was counted as the server's first-token time; during a turn the collector is
    off, and on again between turns (and after a turn that raised)."""
    import json

    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"before": True, "seen": [False, False], "between": [True], "after": True}, got
