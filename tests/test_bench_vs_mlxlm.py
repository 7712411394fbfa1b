"""The pure parts of loadtests/bench_vs_mlxlm: per-request TPOT and goodput, the Poisson arrival
schedule, and the server command lines of each configuration. No servers are started."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from loadtests.bench_vs_mlxlm import COLS, markdown, poisson_plan, ratios_of, server_cmd, summarize, tpot


def rec(ttft: float, latency: float, out: int, prompt: int = 100, cached: int = 0) -> dict:
    return {"ttft": ttft, "latency": latency, "out": out, "prompt": prompt, "cached": cached, "text": ""}


def test_tpot_is_time_after_the_first_token_per_later_token():
    assert tpot(rec(0.5, 2.5, 5)) == pytest.approx(0.5)
    assert tpot(rec(0.1, 0.1, 1)) is None        # a 1-token reply has no time per later token
    assert tpot({"error": "HTTP 503"}) is None


def test_summary_counts_goodput_against_both_objectives():
    records = [
        rec(0.5, 1.5, 11),          # tpot 0.1: good
        rec(1.0, 5.0, 11),          # tpot 0.4: misses the TPOT objective
        rec(3.0, 3.5, 6),           # ttft 3 s: misses the TTFT objective
        rec(0.2, 0.2, 1),           # 1 token: no TPOT, meets the objectives on its TTFT
        rec(2.5, 2.5, 1),           # 1 token, too late
        {"error": "HTTP 500"},      # never counts, and is no successful request
    ]
    s = summarize(records, wall=4.0, slo_ttft=2.0, slo_tpot=0.25)
    assert (s["requests"], s["errors"], s["good"]) == (6, 1, 2)
    assert s["goodput"] == pytest.approx(2 / 4.0)
    assert s["rps"] == pytest.approx(5 / 4.0)
    assert s["tps"] == pytest.approx((11 + 11 + 6 + 1 + 1) / 4.0)
    # TPOTs of the three multi-token replies only: 0.1, 0.4, 0.1 (nearest rank)
    assert s["tpot50"] == pytest.approx(0.1)
    assert s["tpot95"] == pytest.approx(0.4)
    assert s["prefilled"] == 500
    # a looser TPOT objective lets the slow decoder in
    assert summarize(records, wall=4.0, slo_ttft=2.0, slo_tpot=0.5)["good"] == 3


def test_summary_of_a_run_with_only_errors_is_nan_not_a_crash():
    s = summarize([{"error": "x"}], wall=1.0, slo_ttft=2.0, slo_tpot=0.25)
    assert (s["errors"], s["good"], s["goodput"]) == (1, 0, 0.0)
    assert math.isnan(s["ttft95"]) and math.isnan(s["tpot95"])


def test_poisson_schedule_has_the_expected_count_and_is_reproducible():
    a = poisson_plan(rate=2.0, duration=500, seed=7)
    assert abs(len(a) - 1000) < 100              # mean 1000, standard deviation ~32
    times = [t for t, _, _ in a]
    assert times == sorted(times) and 0 < times[0] and times[-1] < 500
    gaps = [t1 - t0 for t0, t1 in zip(times, times[1:])]
    assert sum(gaps) / len(gaps) == pytest.approx(0.5, rel=0.1)
    assert poisson_plan(rate=2.0, duration=500, seed=7) == a
    assert poisson_plan(rate=2.0, duration=500, seed=8) != a
    assert len({q for _, _, q in a}) > 10 and len({s for _, s, _ in a}) > 1
    assert abs(len(poisson_plan(rate=0.5, duration=500, seed=7)) - 250) < 50


def test_defaults_carry_no_batch_flags_and_tuned_the_same_limits_for_all():
    db = Path("/tmp/x.db")
    for kind in ("radixchat", "mlx_lm.server", "vllm-mlx"):
        default = server_cmd(kind, "defaults", "/m", 8000, db, 32)
        assert not any(a.startswith(("--max", "--decode", "--prompt-conc", "--prefill-batch", "--completion"))
                       for a in default), default
    assert server_cmd("radixchat", "tuned", "/m", 8000, db, 32)[-4:] == [
        "--max-batch", "32", "--max-prefill-batch", "8"]
    assert server_cmd("mlx_lm.server", "tuned", "/m", 8000, db, 32)[-4:] == [
        "--decode-concurrency", "32", "--prompt-concurrency", "8"]
    assert server_cmd("vllm-mlx", "tuned", "/m", 8000, db, 32)[-6:] == [
        "--max-num-seqs", "32", "--prefill-batch-size", "8", "--completion-batch-size", "32"]
    assert "--continuous-batching" in server_cmd("vllm-mlx", "defaults", "/m", 8000, db, 32)
    # a variant keeps its own flags in either configuration
    assert server_cmd("radixchat --step-tokens 0", "defaults", "/m", 8000, db, 32)[-2:] == ["--step-tokens", "0"]


def test_ratio_rows_pair_servers_within_a_configuration():
    def row(server, config, tps, good):
        return {**dict.fromkeys((c for c, _, _ in COLS), 1.0), "server": server, "config": config,
                "tps": tps, "goodput": good}

    rows = {"radixchat [defaults]": row("radixchat", "defaults", 300, 2.0),
            "mlx_lm.server [defaults]": row("mlx_lm.server", "defaults", 100, 0.0),
            "radixchat [tuned]": row("radixchat", "tuned", 300, 1.0),
            "mlx_lm.server [tuned]": row("mlx_lm.server", "tuned", 200, 2.0)}
    q = ratios_of(rows)
    assert set(q) == {"radixchat/mlx_lm.server [defaults]", "radixchat/mlx_lm.server [tuned]"}
    assert q["radixchat/mlx_lm.server [defaults]"]["tps"] == pytest.approx(3.0)
    assert q["radixchat/mlx_lm.server [defaults]"]["goodput"] == math.inf
    assert q["radixchat/mlx_lm.server [tuned]"]["goodput"] == pytest.approx(0.5)
    md = markdown({"7": {"rows": rows, "ratios": q}}, "users").splitlines()
    assert len(md) == 2 + 4 + 2
    assert md[-1].startswith("| 7 | radixchat/mlx_lm.server | tuned | ")
    assert all(line.count("|") == md[0].count("|") for line in md)
