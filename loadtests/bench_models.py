"""Benchmark several models on one server: a cold model's first token, and two models busy.

Starts `radixchat serve --model FIRST --model SECOND --no-auth` on a loopback port with a
fresh SQLite file and prints:
  A. time to first token of SECOND's first request (it loads then: the cold start) against
     the same model loaded (median of --rounds, each a new question so that nothing is in
     the prefix cache beyond the chat template's head), and FIRST's TTFT while SECOND loads;
  B. output tokens/s of --users streaming users on FIRST alone for --seconds, the same on
     SECOND alone, then as many users on each at once: what two busy models cost each
     other on the same cores (as a ratio of each one's alone);
  C. the server's memory (RSS) with FIRST alone, with both loaded (after A), and after
     SECOND is unloaded (--model-idle-s: this run waits for it), before B.

    python -m loadtests.bench_models [--first tiny] [--second default] [--users 8] [--seconds 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from loadtests.figures import pct
from radixchat import assets
from tests.support.procs import free_port, start_radixchat, stop_process

QUESTIONS = assets.prompts()["questions"]


def stream(url: str, model: str, text: str, max_tokens: int) -> tuple[float, int]:
    """One streamed chat: (seconds to the first content, content chunks)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    t0, first, chunks = time.perf_counter(), None, 0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content":"' in line.replace(": ", ":"):
                chunks += 1
                first = first if first is not None else time.perf_counter() - t0
    return (first if first is not None else float("nan")), chunks


def rss_mb(pid: int) -> float:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * 4096 / 2**20
    except OSError:  # not Linux: no figure
        return float("nan")


def loaded(url: str) -> dict:
    return {m["id"]: m["loaded"] for m in httpx.get(url + "/v1/models").json()["data"]}


def busy(url: str, models: list[str], users: int, seconds: float) -> dict:
    """`users` streaming users per model for `seconds`: output tokens/s per model."""
    counts = {m: 0 for m in models}
    stop, lock = time.perf_counter() + seconds, threading.Lock()

    def user(model: str, i: int) -> None:
        n = i
        while time.perf_counter() < stop:
            _, chunks = stream(url, model, f"[{model} {i} {n}] {QUESTIONS[n % len(QUESTIONS)]}", 48)
            with lock:
                counts[model] += chunks
            n += users

    threads = [threading.Thread(target=user, args=(m, i)) for m in models for i in range(users)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {m: c / wall for m, c in counts.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--first", default="tiny")
    p.add_argument("--second", default="default")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--idle-s", type=float, default=20.0, help="--model-idle-s of the server")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        flags = ("--model", args.second, "--model-idle-s", str(args.idle_s), "--no-auth", "--no-warm-presets")
        proc = start_radixchat(args.first, Path(tmp) / "radixchat.db", port, Path(tmp) / "log", *flags)
        try:
            first, second = list(loaded(url))
            rss_alone = rss_mb(proc.pid)
            beside: list[float] = []
            side = threading.Thread(
                target=lambda: beside.extend(stream(url, first, QUESTIONS[1], 8)[0] for _ in range(3))
            )
            side.start()
            cold, _ = stream(url, second, QUESTIONS[0], 8)
            side.join()
            warm = [stream(url, second, QUESTIONS[2 + i], 8)[0] for i in range(args.rounds)]
            warm_first = [stream(url, first, QUESTIONS[2 + i], 8)[0] for i in range(args.rounds)]
            rss_both = rss_mb(proc.pid)
            deadline = time.time() + args.idle_s + 60
            while loaded(url)[second] and time.time() < deadline:
                time.sleep(0.5)
            rss_after, unloaded = rss_mb(proc.pid), not loaded(url)[second]
            alone = busy(url, [first], args.users, args.seconds)
            alone.update(busy(url, [second], args.users, args.seconds))  # (it loads again first)
            both = busy(url, [first, second], args.users, args.seconds)
        finally:
            stop_process(proc)
    print(f"models: first {first!r}, second {second!r}; {args.users} users a model, {args.seconds:g} s a phase")
    print(
        f"A. {second} first token: cold (loading) {cold:.2f} s, loaded median {statistics.median(warm):.3f} s "
        f"({cold / statistics.median(warm):.0f}x); {first} meanwhile p95 {pct(beside, 0.95):.3f} s, "
        f"alone median {statistics.median(warm_first):.3f} s"
    )
    print(
        f"B. output tok/s, each alone: {first} {alone[first]:.1f}, {second} {alone[second]:.1f}; both busy: "
        f"{first} {both[first]:.1f} ({both[first] / alone[first]:.2f}x), "
        f"{second} {both[second]:.1f} ({both[second] / alone[second]:.2f}x)"
    )
    print(
        f"C. server RSS: {first} alone {rss_alone:.0f} MB, both loaded {rss_both:.0f} MB, "
        f"after {second} went idle {rss_after:.0f} MB ({'unloaded' if unloaded else 'NOT unloaded'})"
    )


if __name__ == "__main__":
    main()
