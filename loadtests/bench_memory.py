"""Benchmark what the whole server process takes in memory under many users, against what it
says it takes (the weights and the K/V budget).

Starts `radixchat serve` (a fresh SQLite file, --no-auth, --cache-bytes, and any --flag given
after `--`), drives it with --users closed-loop users (bench_vs_mlxlm's plan and drive_closed:
each sends its next turn when the last reply ends), and samples every --every seconds the
process's resident memory (/proc/PID/status VmRSS; VmHWM is the kernel's own peak) and, from
/metrics, MLX's figures as the engine thread last sampled them: arrays alive (active), freed
buffers MLX keeps for reuse (its buffer cache), the highest active since start (peak), the
largest rise within one step over what stayed alive after it (a step's activations and
logits), and the prefix cache's K/V bytes.

Prints, per run: peak RSS against weights + K/V budget, and the excess split into MLX's arrays
beyond weights + budget (of which a step's rise: activations, logits), MLX's buffer cache, and
the rest (what peak RSS leaves: Python, Gradio, the tokenizer, glibc's arenas), each at its
most; then output tok/s. With --variants
"A;B" it runs once per variant, interleaved over --repeats rounds, and prints peak RSS and tok/s
of each as a ratio to the first's. A variant is "default" or words: `serve` flags
("--mlx-cache-bytes 64GiB": no limit in effect) and NAME=VALUE variables for the server
(glibc's MALLOC_MMAP_THRESHOLD_=1048576: blocks of 1 MiB and more mapped and unmapped, never
kept in its arenas).

What this owns: the measurement. The server comes from the project's CLI (tests/support/procs.py
starts and stops it), the load from loadtests/bench_vs_mlxlm.py. Linux only (/proc).

    python -m loadtests.bench_memory [--model default] [--users 32] [--convs 1] [--max-tokens 96]
        [--cache-bytes 512MiB] [--variants "default;--mlx-cache-bytes 64GiB"] [--repeats 1] [-- --flag ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from loadtests.bench_vs_mlxlm import drive_closed, plan
from loadtests.benchmodel import add_model_args, resolve_model
from radixchat.core.config import parse_size
from radixchat.core.models.model_size import weights_bytes
from radixchat.core.platform.memory import arrays_beyond, process_bound, step_activations
from tests.support.procs import free_port, start_radixchat, stop_process

MB = 1e6
# gauges of /metrics this reads (one sample each with one model served)
GAUGES = {
    "active": "radixchat:mlx_active_bytes",
    "cache": "radixchat:mlx_cache_bytes",
    "peak": "radixchat:mlx_peak_bytes",
    "step": "radixchat:mlx_step_peak_bytes",
    "limit": "radixchat:mlx_cache_limit_bytes",
    "kv": "radixchat:prefix_cache_bytes",
}


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of `pid` in bytes (empty once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return {k: int(v) * 1024 for k, v in re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", text, re.M)}


def metrics(http: httpx.Client) -> dict[str, float]:
    """The GAUGES' values now (those the server does not expose are left out)."""
    try:
        text = http.get("/metrics").text
    except httpx.HTTPError:
        return {}
    out = {}
    for key, name in GAUGES.items():
        m = re.search(rf"^{re.escape(name)}{{[^}}]*}} ([0-9.e+]+)$", text, re.M)
        if m:
            out[key] = float(m[1])
    return out


class Sampler(threading.Thread):
    """Samples RSS and the MLX gauges until stopped; keeps every sample."""

    def __init__(self, pid: int, url: str, every: float):
        super().__init__(daemon=True)
        self.pid, self.url, self.every = pid, url, every
        self.samples: list[dict] = []
        self._done = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as http:
            while not self._done.is_set():
                self.samples.append({**proc_status(self.pid), **metrics(http), "t": time.monotonic()})
                self._done.wait(self.every)

    def stop(self) -> list[dict]:
        self._done.set()
        self.join()
        return self.samples


def one_run(model: str, variant: str, args, tmp: Path, tag: str) -> dict:
    """Start a server as `variant` says (see the module's doc), drive it, stop it."""
    port = free_port()
    words = [] if variant == "default" else variant.split()
    env = dict(w.split("=", 1) for w in words if re.fullmatch(r"[A-Z_]+=.*", w))
    flags = ["--no-auth", "--cache-bytes", args.cache_bytes, "--cache-disk-bytes", "0", *args.flags]
    flags += [w for w in words if not re.fullmatch(r"[A-Z_]+=.*", w)]
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the server inherits them (its re-exec too)
    try:
        server = start_radixchat(model, tmp / f"{tag}.db", port, tmp / f"{tag}.log", *flags)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    url = f"http://127.0.0.1:{port}"
    try:
        time.sleep(args.settle)
        sampler = Sampler(server.pid, url, args.every)
        sampler.start()
        time.sleep(args.every * 2)
        idle = sampler.samples[-1]
        res, wall = drive_closed(url, "default", plan(args.users, args.convs, args.seed), args.max_tokens)
        time.sleep(args.every * 2)
        samples = sampler.stop()
        hwm = proc_status(server.pid).get("VmHWM", 0)
    finally:
        stop_process(server)
    ok = [r for r in res if "error" not in r]
    top = max(samples, key=lambda s: s.get("VmRSS", 0))
    return {
        "variant": variant,
        "idle": idle,
        "top": top,
        "hwm": hwm,
        "max_cache": max(s.get("cache", 0) for s in samples),
        "last": samples[-1],
        "requests": len(res),
        "errors": len(res) - len(ok),
        "tps": sum(r["out"] for r in ok) / wall,
    }


def report(r: dict, weights: int, budget: int, vocab: int) -> None:
    top, last, idle = r["top"], r["last"], r["idle"]
    stated = weights + budget
    print(f"{r['variant']}: {r['requests']} requests ({r['errors']} failed), {r['tps']:.1f} output tok/s")
    print(f"  idle after start        RSS {idle.get('VmRSS', 0) / MB:8.0f} MB")
    print(f"  peak RSS (VmHWM)            {r['hwm'] / MB:8.0f} MB")
    print(f"  weights + K/V budget        {stated / MB:8.0f} MB  ({weights / MB:.0f} + {budget / MB:.0f})")
    print(f"  excess                      {(r['hwm'] - stated) / MB:8.0f} MB")
    if "active" not in top:
        print("  (the server exposes no MLX figures: no split)")
        return
    peak, step, hwm = last.get("peak", 0), last.get("step", 0), r["hwm"]
    # the peaks, each as the process reached it: MLX's arrays at their most (the engine reads
    # them around every step), its buffer cache at its most, and what peak RSS leaves
    print(
        f"  MLX arrays at most          {peak / MB:8.0f} MB  ({(peak - weights - budget) / MB:.0f} MB beyond weights + budget,"
    )
    print(f"                                           {(peak - weights) / budget:.1f} x the budget above the weights)")
    print(f"    a step's rise, most       {step / MB:8.0f} MB  (activations, logits, re-laid K/V)")
    print(f"  MLX buffer cache at most    {r['max_cache'] / MB:8.0f} MB  (limit {top.get('limit', 0) / MB:.0f} MB)")
    print(
        f"  the rest (peak RSS - both)  {(hwm - peak - r['max_cache']) / MB:8.0f} MB  (Python, Gradio, tokenizer, glibc)"
    )
    rest_idle = idle["VmRSS"] - idle.get("active", 0) - idle.get("cache", 0)
    print(f"    of which when idle        {rest_idle / MB:8.0f} MB")
    beyond = arrays_beyond(budget, step_activations(vocab, 256, 256))  # serve's defaults
    bound = process_bound(weights, budget, beyond, int(top.get("limit", 0)))[-1][1]
    print(f"  stated bound (doctor's)     {bound / MB:8.0f} MB  (peak RSS {100 * hwm / bound:.0f}% of it)")
    rss, active, cache = top["VmRSS"], top["active"], top.get("cache", 0)
    print(f"  at the highest RSS sample   {rss / MB:8.0f} MB: MLX arrays {active / MB:.0f} MB as of the last step")
    print(f"    (the prefix cache's K/V {top.get('kv', 0) / MB:.0f} MB), buffer cache {cache / MB:.0f} MB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--users", type=int, default=32)
    p.add_argument("--convs", type=int, default=1, help="conversations per user (2-4 turns each)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-bytes", default="512MiB", help="the K/V budget (--cache-bytes)")
    p.add_argument("--variants", default="default", help='server variants, ";" between them (see above)')
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--every", type=float, default=0.25, help="seconds between samples")
    p.add_argument("--settle", type=float, default=3.0, help="seconds to wait after /health answers")
    p.add_argument("flags", nargs="*", help="more `radixchat serve` flags, after --")
    args = p.parse_args()
    if not sys.platform.startswith("linux"):
        raise SystemExit("bench_memory reads /proc: Linux only")
    model = resolve_model(args)
    weights, budget = weights_bytes(model), parse_size(args.cache_bytes)
    vocab = json.loads((Path(model) / "config.json").read_text()).get("vocab_size", 0)
    tmp = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    limits = [v.strip() for v in args.variants.split(";")]
    runs: dict[str, list[dict]] = {v: [] for v in limits}
    for round_ in range(args.repeats):
        for i, v in enumerate(limits):  # interleaved: a slow spell of the machine falls on every variant alike
            runs[v].append(one_run(model, v, args, tmp, f"variant{i}-round{round_}"))
    print(
        f"{Path(model).name}, {args.users} users x {args.convs} conversations, max_tokens {args.max_tokens}, "
        f"--cache-bytes {args.cache_bytes}; logs in {tmp}"
    )
    for v in limits:
        for r in runs[v]:
            report(r, weights, budget, vocab)
    if len(limits) > 1:
        first = runs[limits[0]]
        print(f"against {limits[0]} (medians of {args.repeats}; ratios within each round):")
        for v in limits[1:]:
            rss = statistics.median(b["hwm"] / a["hwm"] for a, b in zip(first, runs[v]))
            tps = statistics.median(b["tps"] / a["tps"] for a, b in zip(first, runs[v]))
            print(f"  {v}: peak RSS x{rss:.3f}, output tok/s x{tps:.3f}")


if __name__ == "__main__":
    main()
