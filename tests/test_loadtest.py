"""The load-test runner end to end: real server, real Locust (as a subprocess), real store."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory):
    from tests.support.randmodel import build_random_model

    # the seed scenario's system prompts are long in the tiny tokenizer: give them room
    return build_random_model(tmp_path_factory.mktemp("lt") / "tiny-2k", context=2048)


def test_short_seed_run_has_no_failures_and_hits_the_cache(long_context_model, tmp_path):
    out = tmp_path / "report"
    run = subprocess.run(
        [sys.executable, "-m", "loadtests.run", "--model", str(long_context_model), "--users", "5",
         "--requests", "60", "--time", "90s", "--think", "0.3", "--max-tokens", "16",
         "--classes", "ApiUser", "PageUser", "--out", str(out)],
        capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = (out / "summary.md").read_text()
    assert "| failures | 0 |" in summary
    assert "(missing: 0)" in summary
    # Locust's own final stats (its --json-file), read here without importing loadtests/
    counts = {(e["method"], e["name"]): e["num_requests"]
              for e in json.loads((out / "locust_final.json").read_text())}
    turns = {name: n for (t, name), n in counts.items() if t == "STREAM"}
    assert sum(turns.values()) == 60
    # both user classes chatted: the API and the page (through Gradio's queue)
    assert any(n.startswith("chat[") for n in turns) and any(n.startswith("page[") for n in turns)
    assert counts[("POST", "/v1/chat/completions")] == sum(
        v for n, v in turns.items() if n.startswith("chat["))
    assert any(t == "TTFT" for t, _ in counts)
    hit = float(summary.split("| cache hit ratio (prompt tokens) | ")[1].split(" ")[0])
    assert hit > 0, summary
    for png in ("throughput.png", "latency.png", "cache_hit_ratio.png"):
        assert (out / png).stat().st_size > 1000
