"""Where a serving process's time goes under many streaming users: a py-spy profile of
`radixchat serve`, summarized by thread and by function.

Starts `radixchat serve` on the model (fresh data folder, --no-auth), drives it with --users
closed-loop users (bench_vs_mlxlm's seed-scenario conversations, streamed, temperature 0), and
meanwhile records the server with py-spy (`py-spy record --format raw --threads`, sampling
--rate a second for --seconds, starting once the users are under way). Prints:

- per thread (the engine thread, the HTTP event loop, the store writer, others; told apart by
  the frames at the root of their stacks), its share of the samples. By default py-spy samples
  only the thread holding the GIL (`--gil`), so the shares say who held it, and the samples
  taken against the ones asked for say how busy the GIL was. With --all-threads it samples
  every thread it thinks is running; in a container it cannot always tell a thread blocked in C
  from a running one, so waits (`Condition.wait`, the event loop's poll) show up there;
- per thread, the functions with the most samples of their own (self time), top --top;
- the load generator's own CPU seconds against the wall, so a reader can tell whether the
  client was the bottleneck (it runs beside the server on the same cores).

py-spy must be installed (`pip install py-spy`) and allowed to read the process (root, or
ptrace permitted). On Linux it re-executes nothing itself: the server re-executes with
OpenBLAS as it always does.

    python -m loadtests.profile_server [--model tiny | --random-dim 256] [--users 32]
        [--seconds 20] [--all-threads] [--top 12] [--out DIR]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

from loadtests.bench_vs_mlxlm import blas_env, drive_closed, plan, server_cmd
from loadtests.benchmodel import add_model_args, resolve_model
from tests.support.procs import free_port, start_and_wait, stop_process

# a thread is named by the first of its root frames that matches (file and function)
THREADS = [
    ("engine", re.compile(r"core/engine/(engine|follower)\.py")),
    ("store writer", re.compile(r"_write_loop")),
    ("HTTP event loop", re.compile(r"uvicorn|asyncio/base_events\.py|asyncio/runners\.py")),
    ("workers (thread pools)", re.compile(r"concurrent/futures/thread\.py|anyio")),
]
FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^()]*):\d+\)$")


def thread_of(frames: list[str]) -> str:
    for name, pattern in THREADS:
        if any(pattern.search(f) for f in frames[:12]):
            return name
    return "other"


def short(frame: str) -> str:
    m = FRAME.match(frame)
    if not m:
        return frame
    path = m["file"]
    for marker in ("site-packages/", "/work/main/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{m['fn']} ({path})"


def summarize(raw: Path, top: int, asked: float) -> None:
    per_thread: Counter = Counter()
    own: dict[str, Counter] = defaultdict(Counter)
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f for f in stack.split(";") if not f.startswith(("thread (", "process "))]
        if not frames:
            continue
        who = thread_of(frames)
        per_thread[who] += int(count)
        own[who][short(frames[-1])] += int(count)
    total = sum(per_thread.values()) or 1
    print(f"{total} samples of {asked:.0f} asked for ({total / asked:.0%}: with --gil, how busy the GIL was)")
    print("| thread | share of samples |")
    print("|---|---|")
    for who, n in per_thread.most_common():
        print(f"| {who} | {n / total:.0%} |")
    for who, _ in per_thread.most_common():
        print(f"\n{who}: functions by own samples (share of all samples)")
        for fn, n in own[who].most_common(top):
            print(f"  {n / total:6.1%}  {fn}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(p)
    p.set_defaults(model="tiny")
    p.add_argument("--users", type=int, default=32)
    p.add_argument("--convs", type=int, default=3, help="conversations per user (enough to outlast the recording)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--rate", type=int, default=200, help="py-spy samples a second")
    p.add_argument("--all-threads", action="store_true", help="sample every running thread, not the GIL's holder")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise SystemExit("py-spy is not installed: pip install py-spy")
    model = resolve_model(args)
    out = args.out or Path(tempfile.mkdtemp(prefix="profile-"))
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = server_cmd("radixchat", "defaults", model, port, out / "profile.db", args.users)
    server = start_and_wait(cmd, f"http://127.0.0.1:{port}/health", out / "server.log", env=blas_env())
    url = f"http://127.0.0.1:{port}"
    result: dict = {}
    load = threading.Thread(
        target=lambda: result.update(
            zip(
                ("rows", "wall"), drive_closed(url, "default", plan(args.users, args.convs, args.seed), args.max_tokens)
            )
        )
    )
    cpu0, t0 = time.process_time(), time.perf_counter()
    try:
        load.start()
        time.sleep(3)  # the users under way, the batch full
        raw = out / "profile.txt"
        spy_cmd = [spy, "record", "--format", "raw", "--threads", "--rate", str(args.rate)]
        spy_cmd += ["--duration", str(int(args.seconds)), "--pid", str(server.pid), "--output", str(raw)]
        spy_cmd += [] if args.all_threads else ["--gil"]
        subprocess.run(spy_cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        load.join()
    finally:
        stop_process(server)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    rows = result.get("rows", [])
    tokens = sum(r.get("out", 0) for r in rows)
    errors = sum("error" in r for r in rows)
    print(
        f"model {model}; {args.users} users, {len(rows)} requests ({errors} failed), "
        f"{tokens / max(result.get('wall', wall), 1e-9):.0f} output tok/s; "
        f"load generator: {cpu:.1f} CPU s in {wall:.1f} s wall ({cpu / wall:.0%} of one core); "
        f"py-spy {'running threads' if args.all_threads else '--gil'}, {args.rate}/s for {args.seconds:.0f} s "
        f"(raw: {raw})"
    )
    summarize(raw, args.top, args.rate * args.seconds)


if __name__ == "__main__":
    main()
