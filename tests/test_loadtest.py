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


@pytest.mark.slow
def test_short_seed_run_has_no_failures_and_hits_the_cache(long_context_model, tmp_path):
    out = tmp_path / "report"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadtests.run",
            "--model",
            str(long_context_model),
            "--users",
            "5",
            "--requests",
            "60",
            "--time",
            "90s",
            "--think",
            "0.3",
            "--max-tokens",
            "16",
            "--classes",
            "ApiUser",
            "PageUser",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    summary = (out / "summary.md").read_text()
    assert "| failures | 0 |" in summary
    assert "(missing: 0)" in summary
    # Locust's own final stats (its --json-file), read here without importing loadtests/
    counts = {(e["method"], e["name"]): e["num_requests"] for e in json.loads((out / "locust_final.json").read_text())}
    turns = {name: n for (t, name), n in counts.items() if t == "STREAM"}
    assert sum(turns.values()) == 60
    # both user classes chatted: the API and the page (through Gradio's queue)
    assert any(n.startswith("chat[") for n in turns) and any(n.startswith("page[") for n in turns)
    assert counts[("POST", "/v1/chat/completions")] == sum(v for n, v in turns.items() if n.startswith("chat["))
    assert any(t == "TTFT" for t, _ in counts)
    hit = float(summary.split("| cache hit ratio (prompt tokens) | ")[1].split(" ")[0])
    assert hit > 0, summary
    for png in ("throughput.png", "latency.png", "cache_hit_ratio.png"):
        assert (out / png).stat().st_size > 1000


@pytest.mark.slow
def test_locust_as_its_users_run_it(long_context_model, tmp_path):
    """`locust -f loadtests/locustfile.py --host URL` with Locust's own flags: no accounts file
    (the page users are skipped, with a word why), no hidden bound on requests."""
    import os
    from pathlib import Path

    from tests.support.procs import free_port, start_radixchat, stop_process

    port = free_port()
    server = start_radixchat(
        str(long_context_model), tmp_path / "l.db", port, tmp_path / "server.log", "--no-auth", "--max-tokens", "2"
    )
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RADIXCHAT_")}
        env.update(RADIXCHAT_THINK_S="0", RADIXCHAT_MAX_TOKENS="2")
        run = subprocess.run(
            [
                str(Path(sys.executable).with_name("locust")),
                "-f",
                "loadtests/locustfile.py",
                "--host",
                f"http://127.0.0.1:{port}",
                "--headless",
                "-u",
                "4",
                "-r",
                "4",
                "-t",
                "25s",
                "--json-file",
                str(tmp_path / "stats"),
            ],
            capture_output=True,
            text=True,
            timeout=200,
            env=env,
            cwd=Path(__file__).resolve().parent.parent,
        )
    finally:
        stop_process(server)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "PageUser skipped: set RADIXCHAT_USERS_FILE" in run.stderr
    stats = json.loads((tmp_path / "stats.json").read_text())
    streamed = sum(e["num_requests"] for e in stats if e["method"] == "STREAM")
    failures = sum(e["num_failures"] for e in stats)
    # the old hidden default stopped every run at 100 requests
    assert streamed > 100 and failures == 0, (streamed, failures)
