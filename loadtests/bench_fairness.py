"""Benchmark fair share: one user's time to first token while another floods the API.

Starts `radixchat serve` on a loopback port with a fresh SQLite file holding two users, A and
B, each with an API key. B chats through the API, streamed, one turn at a time with a short
think time between turns: (a) alone, then (b) while A keeps --flood requests in flight
(non-streaming, ignore_eos, each sent again as soon as it ends). Beyond the server's
--max-user-requests A is refused with 429: each refusal is counted, and the refused worker
waits the server's Retry-After (jittered) before it tries again, so with more workers than
A may have, A stays at its allowed maximum. Prints B's time to first token p50/p95 alone
and under the flood, their ratio (the goal: p95 within 2x), A's output tokens/s
while B was measured, and A's 429s.

Every turn of B is a fresh conversation (one of the seed scenario's system prompts and a
question), tagged with its phase so neither phase finds the other's prompts in the prefix
cache; a warm-up turn caches the system prompt for both. A's requests carry a counter, so
each one's question is prefilled anew.

What this owns: the two clients and the figures. The server, its users and keys are made
with the project's own CLI and core.store. B is timed in this process's main thread; A
runs in a child process's event loop, so the flood's client work never holds the GIL
against the thread that times B. Traffic to 127.0.0.1 only, bounded by --turns and
--duration.

    python -m loadtests.bench_fairness [--model PATH | --random-dim 512 --random-layers 8]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing as mp
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from loadtests.bench_vs_mlxlm import one_turn
from loadtests.benchmodel import add_model_args, resolve_model
from loadtests.figures import pct
from radixchat import assets
from radixchat.core.store import Store
from tests.support.procs import free_port, start_radixchat, stop_process

PROMPTS = assets.prompts()
SYSTEMS = [s["text"] for s in PROMPTS["system_prompts"]]
QUESTIONS = PROMPTS["questions"]


def start_server(model: str, db: Path, port: int, args, log: Path) -> subprocess.Popen:
    flags = ["--max-user-requests", str(args.max_user_requests)]
    if args.max_batch:
        flags += ["--max-batch", str(args.max_batch), "--max-prefill-batch", str(min(args.max_batch, 4))]
    return start_radixchat(model, db, port, log, *flags)


# ---- user A: the flood, in a child process ---------------------------------------------


def flood(
    url: str,
    key: str,
    workers: int,
    max_tokens: int,
    retry_wait: float | None,
    limit_s: float,
    seed: int,
    stop,
    results,
) -> None:
    """Child process: keep `workers` requests of A going until `stop` is set (or `limit_s`
    passes), then put A's figures on `results`."""
    results.put(asyncio.run(_flood(url, key, workers, max_tokens, retry_wait, limit_s, seed, stop)))


async def _flood(url, key, workers, max_tokens, retry_wait, limit_s, seed, stop) -> dict:
    done: list[tuple[float, int]] = []  # (wall clock at the end, output tokens) per served request
    counts = {"sent": 0, "refused": 0, "errors": 0}
    numbers = itertools.count()
    t_start = time.time()
    limits = httpx.Limits(max_connections=workers, max_keepalive_connections=workers)

    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=limit_s, limits=limits
    ) as http:

        async def worker(w: int) -> None:
            rng = random.Random(seed * 1000 + w)
            while not stop.is_set():
                n = next(numbers)
                body = {
                    "model": "default",
                    "max_tokens": max_tokens,
                    "ignore_eos": True,
                    "temperature": 0,
                    "messages": [
                        {"role": "system", "content": rng.choice(SYSTEMS)},
                        {"role": "user", "content": f"[A{n}] {rng.choice(QUESTIONS)}"},
                    ],
                }
                counts["sent"] += 1
                try:
                    r = await http.post("/v1/chat/completions", json=body)
                except httpx.HTTPError:
                    counts["errors"] += 1
                    await asyncio.sleep(0.5)
                    continue
                if r.status_code == 200:
                    done.append((time.time(), r.json()["usage"]["completion_tokens"]))
                elif r.status_code == 429:
                    counts["refused"] += 1
                    # jittered, so the refused workers don't all come back in the same instant
                    wait = retry_wait if retry_wait is not None else float(r.headers.get("retry-after", 1))
                    await asyncio.sleep(wait * rng.uniform(0.5, 1.5))
                else:
                    counts["errors"] += 1
                    await asyncio.sleep(0.5)

        tasks = [asyncio.create_task(worker(w)) for w in range(workers)]
        end = time.time() + limit_s
        while not stop.is_set() and time.time() < end:
            await asyncio.sleep(0.05)
        # cancelling closes their connections, and the server cancels what they asked for
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"done": done, "t_start": t_start, "t_end": time.time(), **counts}


# ---- user B: timed turns in the main thread ----------------------------------------------


def b_turns(http: httpx.Client, phase: str, args, deadline: float, rng: random.Random, on_think=None) -> list[dict]:
    """B's turns, one at a time: each a fresh conversation tagged with `phase`."""
    out = []
    for i in range(args.turns):
        if time.perf_counter() > deadline:
            break
        msgs = [
            {"role": "system", "content": SYSTEMS[0]},
            {"role": "user", "content": f"[B{phase}{i}] {rng.choice(QUESTIONS)}"},
        ]
        try:
            out.append(one_turn(http, "default", msgs, args.max_tokens))
        except httpx.HTTPError as e:
            out.append({"error": str(e)})
        if on_think is not None:
            on_think()
        time.sleep(args.think)
    return out


def in_flight(http: httpx.Client) -> int:
    h = http.get("/health").json()
    return h["active_requests"] + h["queue_depth"]


def summary(rows: list[dict]) -> dict:
    ok = [r["ttft"] for r in rows if "error" not in r]
    return {"turns": len(rows), "errors": len(rows) - len(ok), "p50": pct(ok, 0.5), "p95": pct(ok, 0.95)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--turns", type=int, default=20, help="B's timed turns per phase")
    p.add_argument("--think", type=float, default=0.5, help="B's pause between turns, seconds")
    p.add_argument("--max-tokens", type=int, default=16, help="B's reply length")
    p.add_argument("--flood", type=int, default=64, help="requests A tries to keep in flight")
    p.add_argument("--flood-max-tokens", type=int, default=64, help="A's reply length (ignore_eos)")
    p.add_argument(
        "--retry-wait",
        type=float,
        default=None,
        help="seconds a refused A worker waits (default: the server's Retry-After), jittered",
    )
    p.add_argument("--max-user-requests", type=int, default=32, help="passed to the server")
    p.add_argument("--max-batch", type=int, default=0, help="passed to the server (default: its own)")
    p.add_argument(
        "--settle", type=float, default=3.0, help="seconds between A reaching its maximum and B's first timed turn"
    )
    p.add_argument("--duration", type=float, default=180.0, help="most seconds per phase")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    model = resolve_model(args)

    work = Path(tempfile.mkdtemp(prefix="bench-fairness-"))
    db = work / "fairness.db"
    with Store(db) as store:
        keys = {
            name: store.create_api_key(store.create_user(name, f"{name}-bench-password"), "bench")[1]
            for name in ("usera", "userb")
        }
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(model, db, port, args, work / "server.log")
    a_max = min(args.flood, args.max_user_requests)
    print(f"model {model}; {time.strftime('%Y-%m-%d %H:%M')}; server log {work / 'server.log'}")
    print(
        f"B: {args.turns} streamed turns per phase, max_tokens {args.max_tokens}, think {args.think} s; "
        f"A: {args.flood} in flight wanted, server --max-user-requests {args.max_user_requests}, "
        f"max_tokens {args.flood_max_tokens}"
    )
    ctx = mp.get_context("spawn")
    stop, results = ctx.Event(), ctx.Queue()
    child = None
    try:
        rng = random.Random(args.seed)
        with httpx.Client(
            base_url=url, timeout=args.duration + 60, headers={"Authorization": f"Bearer {keys['userb']}"}
        ) as http:
            one_turn(
                http,
                "default",
                [{"role": "system", "content": SYSTEMS[0]}, {"role": "user", "content": "warm-up"}],
                args.max_tokens,
            )
            alone = b_turns(http, "a", args, time.perf_counter() + args.duration, rng)

            child = ctx.Process(
                target=flood,
                daemon=True,
                args=(
                    url,
                    keys["usera"],
                    args.flood,
                    args.flood_max_tokens,
                    args.retry_wait,
                    2 * args.duration + args.settle + 120,
                    args.seed,
                    stop,
                    results,
                ),
            )
            child.start()
            reach = time.perf_counter() + args.duration
            while in_flight(http) < a_max and time.perf_counter() < reach:
                time.sleep(0.1)
            reached = in_flight(http)
            time.sleep(args.settle)
            samples: list[int] = []  # A's requests at the server, between B's turns
            t0 = time.time()
            loaded = b_turns(
                http,
                "b",
                args,
                time.perf_counter() + args.duration,
                rng,
                on_think=lambda: samples.append(in_flight(http)),
            )
            t1 = time.time()
        stop.set()
        a = results.get(timeout=120)
        child.join(30)
    finally:
        stop.set()
        if child is not None and child.is_alive():
            child.terminate()
        stop_process(server)

    sa, sb = summary(alone), summary(loaded)
    print(f"\n{'B time to first token, s':>32} {'turns':>6} {'errors':>7} {'p50':>8} {'p95':>8}")
    for name, s in (("alone", sa), (f"while A floods ({a_max} in flight)", sb)):
        print(f"{name:>32} {s['turns']:>6} {s['errors']:>7} {s['p50']:>8.3f} {s['p95']:>8.3f}")
    print(
        f"under the flood / alone: p50 {sb['p50'] / sa['p50']:.2f}x, p95 {sb['p95'] / sa['p95']:.2f}x "
        f"(the goal: p95 within 2x)"
    )
    window = [tokens for t, tokens in a["done"] if t0 <= t <= t1]
    span = max(t1 - t0, 1e-9)
    print(
        f"A while B was timed ({span:.1f} s): {len(window)} requests served, {sum(window) / span:.1f} output tokens/s"
    )
    flood_s = a["t_end"] - a["t_start"]
    print(
        f"A over the whole flood ({flood_s:.1f} s): {a['sent']} sent, {len(a['done'])} served, {a['refused']} refused "
        f"with 429 ({a['refused'] / flood_s:.1f}/s), {a['errors']} errors; the rest were in flight at the stop"
    )
    med = statistics.median(samples) if samples else float("nan")
    print(
        f"A's requests at the server: {reached} when B started, median {med:g} between B's turns "
        f"(A's limit {a_max}; B's own request is done by then)"
    )


if __name__ == "__main__":
    main()
