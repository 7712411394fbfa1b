"""Benchmark radixchat against mlx-lm's own server (and vllm-mlx where installed), side by
side in one run, the way a user would compare them.

Every server is started fresh for each measurement on a loopback port, on the same model
with the same BLAS set-up (OpenBLAS preloaded on Linux), in two configurations:

  defaults  each started exactly as a user would run it:
              radixchat serve --model M --port P --no-auth --db D --cache-dir D.kv
                (the disk tier on, as `serve` has it, but empty at each start: a tier shared
                by the measurements would hold the same conversations from the one before)
              python -m mlx_lm.server --model M --port P
              vllm-mlx serve M --port P --continuous-batching
  tuned     the same batch limits for all, N = max(users, 8) (--poisson-batch in poisson mode):
              radixchat ... --max-batch N --max-prefill-batch min(N, 8)
              mlx_lm.server ... --decode-concurrency N --prompt-concurrency min(N, 8)
              vllm-mlx ... --max-num-seqs N --prefill-batch-size min(N, 8) --completion-batch-size N

Two ways of sending the same fixed requests (the seed scenario of assets/prompts.json: 4
system prompts x 30 questions, temperature 0, fixed max_tokens, fixed random seed, streamed):

  --arrivals closed   (default) each of --users users holds --convs multi-turn conversations
                      and sends its next turn when the last reply ends;
  --arrivals poisson  requests arrive by a Poisson process at each of --rates requests/s for
                      --duration s, each a fresh single-turn chat, sent whether or not earlier
                      ones finished; the run then waits for those in flight.

Per user count (or rate), a row per server and configuration: requests, errors, requests/s,
output tokens/s, time to first token p50/p95, time per output token after the first (TPOT)
p50/p95, latency p95, goodput (requests/s that met both --slo-ttft and --slo-tpot), prompt
tokens actually prefilled, peak RSS; then the ratios radixchat / mlx_lm.server (and
radixchat / vllm-mlx) per configuration, and in closed mode the engine's ceiling on this
machine (a raw batched greedy decode loop on the same model at batch = users). Writes
summary.json, table.md (ready for BENCHMARKS.md) and comparison.png into --out.

One run per server cannot settle a ratio near the goals on a noisy machine (the same server's
output can vary by a fifth between runs), so --repeats N measures every server N times per user
count (or rate), in interleaved rounds: round 1 runs each server once in the usual order, round 2
runs them all again, and so on, each a fresh server process (logs end in -r1, -r2, ...); never
all repeats of one server back to back, so a slow spell of the machine falls on every server
alike. Each row then gives the median over rounds of every figure, with the min-max of output
tokens/s and TTFT p95 after it. A ratio is taken within each round (radixchat against the other
server as measured in the same round, minutes apart, not against its median) and given as the
median with the min-max over rounds, followed by how many rounds reached each of radixchat's goals:
output >= 1.5x and TTFT p95 <= 0.5x against mlx_lm.server, output > 1x and TTFT p95 < 1x against
vllm-mlx. summary.json keeps every round's rows and ratios besides the medians; table.md and
comparison.png show the medians (the plot with min-max error bars).

    python -m loadtests.bench_vs_mlxlm [--model PATH | --random-dim 1024 --random-layers 12]
        [--users 1,7,32,64 --convs 2] [--configs defaults,tuned] [--variant='--step-tokens 0'] [--repeats 5]
    python -m loadtests.bench_vs_mlxlm --arrivals poisson --rates 0.5,1,2 --duration 60
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from loadtests.benchmodel import add_model_args, resolve_model
from loadtests.figures import pct
from radixchat import assets
from radixchat.core.platform.blas import REEXEC_MARK, find_openblas, openblas_env
from tests.support.procs import clear_state, free_port, peak_rss_mb, start_and_wait, stop_process

PROMPTS = assets.prompts()
CONFIGS = ("defaults", "tuned")
# vllm-mlx's batch limits, as `vllm-mlx serve` declares them in waybarrios/vllm-mlx
# vllm_mlx/cli.py (serve_parser: --max-num-seqs, default 256; --prefill-batch-size, default 8;
# --completion-batch-size, default 32; passed to its SchedulerConfig when --continuous-batching).
# The installed version's --help is checked too before the tuned configuration is run.
VLLM_TUNED_FLAGS = ("--max-num-seqs", "--prefill-batch-size", "--completion-batch-size")
# (key, header, format): the columns of every table, printed and in table.md
COLS = [
    ("requests", "requests", "{}"),
    ("errors", "errors", "{}"),
    ("rps", "req/s", "{:.2f}"),
    ("tps", "tps", "{:.1f}"),
    ("ttft50", "ttft p50", "{:.3f}"),
    ("ttft95", "ttft p95", "{:.3f}"),
    ("tpot50", "tpot p50", "{:.4f}"),
    ("tpot95", "tpot p95", "{:.4f}"),
    ("lat95", "lat p95", "{:.2f}"),
    ("goodput", "goodput", "{:.2f}"),
    ("goodput_loose", "goodput xS", "{:.2f}"),
    ("prefilled", "prefilled", "{}"),
    ("rss", "peak rss", "{:.0f}"),
]
RATIO_COLS = ("tps", "ttft95", "tpot95", "goodput", "goodput_loose")
# With --repeats: the figures whose spread over rounds each server row shows (the ones the goals are on)
SPREAD_COLS = ("tps", "ttft95")
# radixchat's goals against the other servers, tested on each round's ratios: (other server, figure, test, as printed)
GOALS = (
    ("mlx_lm.server", "tps", lambda q: q >= 1.5, "output >= 1.5x"),
    ("mlx_lm.server", "ttft95", lambda q: q <= 0.5, "TTFT p95 <= 0.5x"),
    ("vllm-mlx", "tps", lambda q: q > 1, "output > 1x"),
    ("vllm-mlx", "ttft95", lambda q: q < 1, "TTFT p95 < 1x"),
)


def blas_env() -> dict:
    """The same BLAS set-up for every process measured: what radixchat would re-exec into."""
    env = dict(os.environ)
    lib = find_openblas()
    if sys.platform.startswith("linux") and lib:
        env = openblas_env({**env, "LD_PRELOAD": lib, REEXEC_MARK: "1"})
    return env


def plan(users: int, convs_per_user: int, seed: int) -> list[list[tuple[int, list[str]]]]:
    """Closed loop: per user, its conversations (system prompt index, 2-4 questions)."""
    rng = random.Random(seed)
    return [
        [
            (rng.randrange(len(PROMPTS["system_prompts"])), rng.sample(PROMPTS["questions"], rng.randint(2, 4)))
            for _ in range(convs_per_user)
        ]
        for _ in range(users)
    ]


def poisson_plan(rate: float, duration: float, seed: int) -> list[tuple[float, int, str]]:
    """Open loop: (seconds after the start, system prompt index, question) per request, arriving
    by a Poisson process of `rate` per second (exponential gaps) until `duration`."""
    rng = random.Random(seed)
    out, t = [], rng.expovariate(rate)
    while t < duration:
        out.append((t, rng.randrange(len(PROMPTS["system_prompts"])), rng.choice(PROMPTS["questions"])))
        t += rng.expovariate(rate)
    return out


def vllm_mlx() -> str | None:
    """The vllm-mlx command, on PATH or next to this Python (an optional comparison, never a dependency)."""
    return shutil.which("vllm-mlx") or shutil.which("vllm-mlx", path=str(Path(sys.executable).parent))


def vllm_has_batch_flags(exe: str) -> bool:
    try:
        text = subprocess.run([exe, "serve", "--help"], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return all(flag in text for flag in VLLM_TUNED_FLAGS)


def server_cmd(kind: str, config: str, model: str, port: int, db: Path, batch: int) -> list[str]:
    """The command line of one server; `kind` "radixchat --flag value ..." is a variant with its flags."""
    tuned = config == "tuned"
    if kind.startswith("radixchat"):
        cmd = [
            str(Path(sys.executable).with_name("radixchat")),
            "serve",
            "--model",
            model,
            "--port",
            str(port),
            "--no-auth",
            "--db",
            str(db),
            # a disk tier of its own: by default it is the db's folder's, which every
            # measurement shares, so later ones found the same conversations already cached
            "--cache-dir",
            str(db.with_suffix(".kv")),
        ]
        tuning = ["--max-batch", str(batch), "--max-prefill-batch", str(min(batch, 8))]
        return cmd + (tuning if tuned else []) + kind.split()[1:]
    if kind == "mlx_lm.server":
        cmd = [sys.executable, "-m", "mlx_lm.server", "--model", model, "--port", str(port)]
        tuning = ["--decode-concurrency", str(batch), "--prompt-concurrency", str(min(batch, 8))]
        return cmd + (tuning if tuned else [])
    if kind == "vllm-mlx":
        cmd = [vllm_mlx() or "vllm-mlx", "serve", model, "--port", str(port), "--continuous-batching"]
        tuning = [
            "--max-num-seqs",
            str(batch),
            "--prefill-batch-size",
            str(min(batch, 8)),
            "--completion-batch-size",
            str(batch),
        ]
        return cmd + (tuning if tuned else [])
    raise ValueError(kind)


def one_turn(http: httpx.Client, model: str, messages, max_tokens: int, t0: float | None = None) -> dict:
    """One streamed chat completion. `t0` is when the request was due (open loop): time spent
    before it went out, e.g. waiting for a thread, counts towards its TTFT and latency."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter() if t0 is None else t0
    first, parts, usage = None, [], None
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return {"error": f"HTTP {r.status_code}"}
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for ch in chunk.get("choices") or []:
                text = (ch.get("delta") or {}).get("content")
                if text:
                    first = first or time.perf_counter()
                    parts.append(text)
    end = time.perf_counter()
    if usage is None:
        return {"error": "no usage"}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
    return {
        "ttft": (first or end) - t0,
        "latency": end - t0,
        "text": "".join(parts),
        "out": usage["completion_tokens"],
        "prompt": usage["prompt_tokens"],
        "cached": cached,
    }


def safe_turn(http, model, messages, max_tokens, t0=None) -> dict:
    try:
        return one_turn(http, model, messages, max_tokens, t0)
    except httpx.HTTPError as e:
        return {"error": str(e) or type(e).__name__}


def system_message(index: int) -> dict:
    return {"role": "system", "content": PROMPTS["system_prompts"][index]["text"]}


def drive_closed(url: str, model: str, work, max_tokens: int) -> tuple[list[dict], float]:
    """Each user sends its next turn when the last reply ends; a user stops at its first error."""
    results, lock = [], threading.Lock()

    def user(convs):
        with httpx.Client(base_url=url, timeout=600) as http:
            for system, questions in convs:
                msgs = [system_message(system)]
                for q in questions:
                    msgs.append({"role": "user", "content": q})
                    r = safe_turn(http, model, msgs, max_tokens)
                    with lock:
                        results.append(r)
                    if "error" in r:
                        return
                    msgs.append({"role": "assistant", "content": r["text"]})

    threads = [threading.Thread(target=user, args=(w,)) for w in work]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - t0


def drive_open(url: str, model: str, arrivals, max_tokens: int) -> tuple[list[dict], float]:
    """Each arrival a fresh single-turn chat on its own thread, sent at its time whether or not
    earlier ones finished; returns once every one has."""
    results, lock, threads = [], threading.Lock(), []
    # No connection limit: a pool that made requests wait for a free connection would close the loop.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    with httpx.Client(base_url=url, timeout=600, limits=limits) as http:

        def request(due, system, question):
            r = safe_turn(
                http, model, [system_message(system), {"role": "user", "content": question}], max_tokens, t0=due
            )
            with lock:
                results.append(r)

        t0 = time.perf_counter()
        for at, system, question in arrivals:
            time.sleep(max(0.0, t0 + at - time.perf_counter()))
            threads.append(threading.Thread(target=request, args=(t0 + at, system, question)))
            threads[-1].start()
        for t in threads:
            t.join()
    return results, time.perf_counter() - t0


def tpot(r: dict) -> float | None:
    """Seconds per output token after the first; None for an error or a reply of under 2 tokens."""
    if "error" in r or r["out"] < 2:
        return None
    return (r["latency"] - r["ttft"]) / (r["out"] - 1)


def summarize(res: list[dict], wall: float, slo_ttft: float, slo_tpot: float, slo_scale: float = 1.0) -> dict:
    """The figures of one run from its request records (see one_turn) and its wall time;
    goodput_loose is goodput with both objectives `slo_scale` times looser."""
    ok = [r for r in res if "error" not in r]
    tpots = [t for t in map(tpot, ok) if t is not None]

    def met(r, scale):  # a reply of 0-1 tokens has no time per token: it meets that objective by having none
        return r["ttft"] <= slo_ttft * scale and (tpot(r) is None or tpot(r) <= slo_tpot * scale)

    good = [r for r in ok if met(r, 1.0)]
    loose = [r for r in ok if met(r, slo_scale)]
    return {
        "requests": len(res),
        "errors": len(res) - len(ok),
        "wall": wall,
        "rps": len(ok) / wall,
        "tps": sum(r["out"] for r in ok) / wall,
        "ttft50": pct([r["ttft"] for r in ok], 0.5),
        "ttft95": pct([r["ttft"] for r in ok], 0.95),
        "tpot50": pct(tpots, 0.5),
        "tpot95": pct(tpots, 0.95),
        "lat50": pct([r["latency"] for r in ok], 0.5),
        "lat95": pct([r["latency"] for r in ok], 0.95),
        "goodput": len(good) / wall,
        "good": len(good),
        "goodput_loose": len(loose) / wall,
        "prefilled": sum(r["prompt"] - r["cached"] for r in ok),
        "prompt": sum(r["prompt"] for r in ok),
    }


def ratio(a: float, b: float) -> float:
    return a / b if b else (float("inf") if a else float("nan"))


def times(q: float) -> str:
    """A ratio as printed: 0/0 (e.g. no request met the goodput objectives on either side) is n/a."""
    return "n/a" if q != q else f"{q:.2f}x"


def median(xs: list) -> float:
    """Median over rounds, NaN rounds left out (a round can lack a figure, e.g. TPOT of 1-token
    replies); counts stay whole numbers where the median is one, so they print as before."""
    xs = [x for x in xs if x == x]
    if not xs:
        return float("nan")
    m = statistics.median(xs)
    return int(m) if all(isinstance(x, int) for x in xs) and m == int(m) else m


def combine(records: list[dict], spread) -> dict:
    """One record (a row or a ratio row) from the same record of every round: the median of each
    figure, and "<figure>_range": [min, max] over rounds for those in `spread`."""
    out = {k: v if isinstance(v, str) else median([r[k] for r in records]) for k, v in records[0].items()}
    for c in spread:
        xs = [r[c] for r in records if r[c] == r[c]]
        out[f"{c}_range"] = [min(xs), max(xs)] if xs else [float("nan")] * 2
    return out


def goals_met(rounds: list[dict]) -> dict:
    """Per ratio row, in how many rounds each of its two goals in GOALS held, and both at once."""
    out = {}
    for name in rounds[0]:
        other = name.split("/")[1].split(" [")[0]
        tests = [(c, ok, words) for o, c, ok, words in GOALS if o == other]
        hits = [[ok(q[name][c]) for c, ok, _ in tests] for q in rounds]  # NaN fails every test
        out[name] = {words: sum(h[i] for h in hits) for i, (_, _, words) in enumerate(tests)}
        out[name]["both"] = sum(all(h) for h in hits)
    return out


def cell(r: dict, c: str, f: str) -> str:
    """A server row's figure as printed, with its min-max over rounds after it where it has one."""
    lo, hi = r.get(f"{c}_range", (None, None))
    return f.format(r[c]) + ("" if lo is None or lo != lo else f" ({f.format(lo)}-{f.format(hi)})")


def ratio_cell(q: dict, c: str) -> str:
    """A ratio as printed, with its min-max over rounds after it where it has one."""
    lo, hi = q.get(f"{c}_range", (None, None))
    return times(q[c]) + ("" if lo is None or lo != lo else f" ({lo:.2f}-{hi:.2f}x)")


def measure(kind: str, config: str, model: str, batch: int, drive, work, args, log: Path) -> dict:
    """Start one server, empty, send it `work` with drive_closed or drive_open, stop it."""
    port, db = free_port(), log.with_suffix(".db")
    clear_state(db)
    proc = start_and_wait(
        server_cmd(kind, config, model, port, db, batch),
        f"http://127.0.0.1:{port}/v1/models",
        log,
        env=blas_env(),
    )
    try:
        served = "default" if kind.startswith("radixchat") else model  # vllm-mlx: the path, as mlx_lm.server
        res, wall = drive(f"http://127.0.0.1:{port}", served, work, args.max_tokens)
        rss = peak_rss_mb(proc.pid)
    finally:
        stop_process(proc)
    return {
        "server": kind,
        "config": config,
        **summarize(res, wall, args.slo_ttft, args.slo_tpot, args.slo_scale),
        "rss": rss,
    }


def decode_ceiling(model_path: str, batch: int, context: int, steps: int = 48) -> float:
    """Tokens/s of a bare batched greedy decode loop: no scheduler, no HTTP, with radixchat's
    model ops (--cpu-ops on a CPU: the fastest this model decodes here; loadtests.bench_decode
    compares them with mlx-lm's)."""
    code = f"""
import time, mlx.core as mx
from radixchat.core.engine.step import cpu_ops
from radixchat.core.models.model import load_model
from mlx_lm.models.cache import make_prompt_cache
m = load_model({model_path!r}).model
cpu_ops.install(m)
cpu_ops.use_here(True)
cache = make_prompt_cache(m)
x = mx.array([[(i * 7 + b) % 500 + 10 for i in range({context})] for b in range({batch})])
mx.eval(m(x, cache=cache))
y = mx.zeros(({batch}, 1), dtype=mx.uint32)
mx.eval(m(y, cache=cache))
t0 = time.perf_counter()
for _ in range({steps}):
    y = mx.argmax(m(y, cache=cache)[:, -1:, :], axis=-1)
    mx.eval(y)
print({batch} * {steps} / (time.perf_counter() - t0))
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=blas_env(),
        cwd=str(Path(__file__).resolve().parent.parent),
    )
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def ratios_of(rows: dict) -> dict:
    """radixchat / each other server, per configuration, on RATIO_COLS."""
    out = {}
    for config in CONFIGS:
        a = rows.get(f"radixchat [{config}]")
        for other in ("mlx_lm.server", "vllm-mlx"):
            b = rows.get(f"{other} [{config}]")
            if a and b:
                out[f"radixchat/{other} [{config}]"] = {c: ratio(a[c], b[c]) for c in RATIO_COLS}
    return out


def print_table(title: str, rows: dict, ratios: dict, goals: dict | None = None, repeats: int = 1) -> None:
    width = max(24, *(len(k) for k in [*rows, *ratios]))
    cells = [[cell(r, c, f) for c, _, f in COLS] for r in rows.values()] + [
        [ratio_cell(q, c) if c in q else "" for c, _, _ in COLS] for q in ratios.values()
    ]
    # 10 wide, so one run prints as it always has; min-max ranges widen their columns to fit
    widths = [max([10, len(COLS[i][1]) + 1] + [len(line[i]) + 1 for line in cells]) for i in range(len(COLS))]
    print(f"\n{title}" + (f" (median of {repeats} rounds, min-max)" if repeats > 1 else ""))
    print(f"{'':>{width}}" + "".join(f"{h:>{w}}" for (_, h, _), w in zip(COLS, widths)))
    for name, line in zip([*rows, *ratios], cells):
        print(f"{name:>{width}}" + "".join(f"{text:>{w}}" for text, w in zip(line, widths)))
    for name, met in (goals or {}).items():
        print(f"{name}: " + ", ".join(f"{words} in {n}/{repeats} rounds" for words, n in met.items()))


def markdown(points: dict, axis: str) -> str:
    """One table of every point: a row per server and configuration, then the ratio rows; with
    --repeats, medians with min-max, and below the table the rounds that reached each goal."""
    lines = [
        f"| {axis} | server | config | " + " | ".join(h for _, h, _ in COLS) + " |",
        "|---" * (len(COLS) + 3) + "|",
    ]
    n = max(len(point.get("rounds", ())) for point in points.values())
    goals = []
    for label, point in points.items():
        for r in point["rows"].values():
            lines.append(
                f"| {label} | {r['server']} | {r['config']} | " + " | ".join(cell(r, c, f) for c, _, f in COLS) + " |"
            )
        for name, q in point["ratios"].items():
            servers, config = name.split(" [")
            lines.append(
                f"| {label} | {servers} | {config.rstrip(']')} | "
                + " | ".join(ratio_cell(q, c) if c in q else "" for c, _, _ in COLS)
                + " |"
            )
        for name, met in point.get("goals", {}).items():
            goals.append(
                f"- {label} {axis}, {name}: " + ", ".join(f"{words} in {k}/{n} rounds" for words, k in met.items())
            )
    if n > 1:
        lines.append(
            f"\nMedian of {n} interleaved rounds, min-max in brackets; each ratio paired within a round."
            + (" Rounds that reached each goal:\n" if goals else "")
        )
    return "\n".join(lines + goals) + "\n"


def combine_runs(runs: list[dict]) -> dict:
    """One point from its rounds (each {name: row}): rows and ratios as one run gives them, or with
    several rounds their medians with min-max, every round's raw rows and ratios, and the goals met.
    Ratios pair the servers of the same round, not the medians, so their spread is the rounds'."""
    per_round = [ratios_of(rows) for rows in runs]
    if len(runs) == 1:
        return {"rows": runs[0], "ratios": per_round[0]}
    return {
        "rows": {name: combine([rows[name] for rows in runs], SPREAD_COLS) for name in runs[0]},
        "ratios": {name: combine([q[name] for q in per_round], RATIO_COLS) for name in per_round[0]},
        "goals": goals_met(per_round),
        "rounds": [{"rows": rows, "ratios": q} for rows, q in zip(runs, per_round)],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--users", default="1,7,32,64", help="closed loop: user counts")
    p.add_argument("--convs", type=int, default=2, help="closed loop: conversations per user")
    p.add_argument("--arrivals", choices=("closed", "poisson"), default="closed")
    p.add_argument("--rates", default="0.5,1,2", help="poisson: arrival rates, requests/s")
    p.add_argument("--duration", type=float, default=60, help="poisson: seconds of arrivals per rate")
    p.add_argument("--poisson-batch", type=int, default=64, help="poisson: N of the tuned configuration")
    p.add_argument("--configs", default="defaults,tuned", help="defaults, tuned or both")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--slo-ttft", type=float, default=2.0, help="goodput: most seconds to first token")
    p.add_argument("--slo-tpot", type=float, default=0.25, help="goodput: most seconds per later token")
    p.add_argument(
        "--slo-scale",
        type=float,
        default=4.0,
        help="the 'goodput xS' column: goodput with both objectives this many times looser "
        "(one a CPU can meet at 32-64 users, where nobody meets the default SLO)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("bench-vs-mlxlm"))
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        help="also run radixchat with these extra flags, e.g. --variant='--step-tokens 0' (repeatable)",
    )
    p.add_argument("--no-mlxlm", action="store_true", help="radixchat (and its variants) only")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="measure every server this many times per point, in interleaved rounds; "
        "report medians with min-max, ratios paired within a round",
    )
    args = p.parse_args()
    configs = args.configs.split(",")
    if not configs or set(configs) - set(CONFIGS):
        p.error(f"--configs takes {', '.join(CONFIGS)}")
    if args.repeats < 1:
        p.error("--repeats takes 1 or more")
    model = resolve_model(args)
    args.out.mkdir(parents=True, exist_ok=True)
    closed = args.arrivals == "closed"
    load = (
        f"{args.convs} conversations per user" if closed else f"poisson arrivals for {args.duration:g} s, single-turn"
    )
    rounds_note = f"; {args.repeats} interleaved rounds" if args.repeats > 1 else ""
    print(
        f"model {model}; max_tokens {args.max_tokens}; {load}; configs {','.join(configs)}{rounds_note}; "
        f"SLO ttft <= {args.slo_ttft:g} s, tpot <= {args.slo_tpot:g} s (goodput xS: x{args.slo_scale:g}); "
        f"blas {'openblas' if find_openblas() else 'bundled'}; {time.strftime('%Y-%m-%d %H:%M')}"
    )

    servers = ["radixchat"] + [f"radixchat {v}" for v in args.variant]
    vllm_configs = []
    if not args.no_mlxlm:
        servers.append("mlx_lm.server")
        exe = vllm_mlx()
        if exe is None:
            print("vllm-mlx: not installed (pip install vllm-mlx), skipped")
        else:
            servers.append("vllm-mlx")
            vllm_configs = [c for c in configs if c == "defaults" or vllm_has_batch_flags(exe)]
            if "tuned" in configs and "tuned" not in vllm_configs:
                print(
                    f"vllm-mlx: `{exe} serve --help` lists no {'/'.join(VLLM_TUNED_FLAGS)}; "
                    "its defaults configuration only"
                )

    points = {}
    for x in (args.users if closed else args.rates).split(","):
        if closed:
            users = int(x)
            batch, title = max(users, 8), f"{users} user(s)"
            drive, work = drive_closed, plan(users, args.convs, args.seed)
        else:
            drive, work = drive_open, poisson_plan(float(x), args.duration, args.seed)
            batch = args.poisson_batch
            title = f"poisson {x} requests/s for {args.duration:g} s ({len(work)} requests)"
        runs = [{} for _ in range(args.repeats)]
        for i, rows in enumerate(runs, 1):  # every server once per round: a slow spell hits them all
            tag = f"-r{i}" if args.repeats > 1 else ""
            for config in configs:
                for kind in servers:
                    if kind == "vllm-mlx" and config not in vllm_configs:
                        continue
                    name = f"{kind} [{config}]"
                    print(
                        f"  {title}: {name}{f' round {i}/{args.repeats}' if tag else ''} ...",
                        file=sys.stderr,
                        flush=True,
                    )
                    log = args.out / f"{kind.replace(' ', '').replace('-', '')}-{config}-{x}{tag}.log"
                    rows[name] = measure(kind, config, model, batch, drive, work, args, log)
        point = combine_runs(runs)
        rows, ratios = point["rows"], point["ratios"]
        print_table(title, rows, ratios, point.get("goals"), args.repeats)
        ceiling = None
        if closed:  # one raw decode loop per user count: it does not depend on any server's flags
            ceiling = decode_ceiling(model, users, context=300)
            shares = ", ".join(f"{n} {r['tps'] / ceiling:.0%}" for n, r in rows.items() if n.startswith("radixchat"))
            print(
                f"raw batched decode ceiling (batch {users}): {ceiling:.1f} tok/s; output as a share of it: "
                f"{shares} (includes prefill and think-free turns)"
            )
        points[x] = {**point, "ceiling": ceiling}

    summary = {
        "arrivals": args.arrivals,
        "model": model,
        "max_tokens": args.max_tokens,
        "slo_ttft": args.slo_ttft,
        "slo_tpot": args.slo_tpot,
        "slo_scale": args.slo_scale,
        "configs": configs,
        **({"convs": args.convs} if closed else {"duration": args.duration}),
        **({"repeats": args.repeats} if args.repeats > 1 else {}),
        "points": points,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    (args.out / "table.md").write_text(markdown(points, "users" if closed else "rate/s"))
    plot(
        points,
        args.out / "comparison.png",
        "users" if closed else "requests/s",
        title=f"{Path(model).name}, max_tokens {args.max_tokens}, {args.arrivals} arrivals",
    )
    print(f"\nwrote {args.out / 'summary.json'}, {args.out / 'table.md'}, {args.out / 'comparison.png'}")


def plot(points: dict, path: Path, unit: str, title: str) -> None:
    """Output tokens/s and time to first token p95 per user count (or rate), every server and config."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(points)
    names = list(dict.fromkeys(n for pt in points.values() for n in pt["rows"]))
    width = 0.8 / len(names)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((axes[0], "tps", "output tokens/s"), (axes[1], "ttft95", "time to first token p95, s")):
        for i, name in enumerate(names):
            xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(labels))]
            rows = [points[x]["rows"].get(name, {}) for x in labels]
            ys = [r.get(key, float("nan")) for r in rows]
            ax.bar(xs, ys, width=width, label=name, yerr=spread(rows, key, ys))
        ax.set_xticks(range(len(labels)), [f"{x} {unit}" for x in labels])
        ax.set_title(label)
    axes[0].legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def spread(rows: list[dict], key: str, ys: list[float]):
    """Error bars from each row's min-max over rounds (below, above the median); None for one run."""
    ranges = [r.get(f"{key}_range") or [float("nan")] * 2 for r in rows]  # a point this server lacks
    if all(r.get(f"{key}_range") is None for r in rows):
        return None
    return [[y - lo for y, (lo, _) in zip(ys, ranges)], [hi - y for y, (_, hi) in zip(ys, ranges)]]


if __name__ == "__main__":
    main()
