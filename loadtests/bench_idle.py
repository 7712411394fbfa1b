"""Benchmark what an idle server costs: CPU while nobody uses it.

Starts `radixchat serve` on a loopback port (a fresh SQLite file, the default flags but for
--db and the port, plus any --flag given after `--`), waits until /health answers and then
--settle seconds more (start-up work such as the disk tier's warm-up ends), then reads the
process's CPU time (utime + stime of /proc/PID/stat, all its threads) before and after
--seconds of nobody calling it. Prints the share of one core it used, the main thread's
(the event loop: uvicorn, Gradio's queue) and the other threads' (the engine, the disk
tier, the store), so whichever polls shows itself.

What this owns: the measurement; the server comes from the project's CLI (tests/support/procs.py
starts and stops it). Linux only (/proc). No requests are sent but the /health probes of the
start.

    python -m loadtests.bench_idle [--model tiny] [--seconds 30] [-- --no-auth ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from loadtests.benchmodel import add_model_args, resolve_model
from tests.support.procs import free_port, start_radixchat, stop_process

TICK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(stat: Path) -> int:
    """utime + stime of a /proc stat file, in clock ticks."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5), counted from 1


def threads(pid: int) -> dict[int, tuple[str, int]]:
    """Each live thread of `pid`: tid -> (name, CPU ticks)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = ((task / "comm").read_text().strip(), cpu_ticks(task / "stat"))
        except (OSError, ValueError):  # ended meanwhile
            pass
    return out


def measure(pid: int, seconds: float) -> tuple[float, list[tuple[str, float]]]:
    """(% of one core the process used over `seconds`, [(thread name, % of a core)] busiest first)."""
    stat = Path(f"/proc/{pid}/stat")
    t0, before, per0 = time.monotonic(), cpu_ticks(stat), threads(pid)
    time.sleep(seconds)
    t1, after, per1 = time.monotonic(), cpu_ticks(stat), threads(pid)
    wall = t1 - t0
    by_name: dict[str, int] = defaultdict(int)
    for tid, (name, ticks) in per1.items():
        # Python names no thread for the OS (all are "python"): the main one runs the event loop
        label = "main thread (event loop)" if tid == pid else f"other threads ({name})"
        by_name[label] += ticks - per0.get(tid, (name, 0))[1]
    ranked = sorted(((n, 100 * t / TICK / wall) for n, t in by_name.items()), key=lambda x: -x[1])
    return 100 * (after - before) / TICK / wall, ranked


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.set_defaults(model="tiny")
    p.add_argument("--seconds", type=float, default=30.0, help="how long to measure (default 30)")
    p.add_argument("--settle", type=float, default=10.0, help="seconds to wait after /health answers (default 10)")
    p.add_argument("flags", nargs="*", help="more `radixchat serve` flags, after --")
    args = p.parse_args()
    if not sys.platform.startswith("linux"):
        raise SystemExit("bench_idle reads /proc: Linux only")
    model = resolve_model(args)
    tmp = Path(tempfile.mkdtemp(prefix="bench-idle-"))
    port = free_port()
    server = start_radixchat(model, tmp / "idle.db", port, tmp / "server.log", *args.flags)
    try:
        time.sleep(args.settle)
        total, ranked = measure(server.pid, args.seconds)
    finally:
        stop_process(server)
    print(f"idle server ({Path(model).name}, {' '.join(args.flags) or 'default flags'}), {args.seconds:.0f} s:")
    print(f"  CPU {total:.2f}% of one core")
    for name, share in ranked:
        print(f"    {name:<28} {share:.2f}%")


if __name__ == "__main__":
    main()
