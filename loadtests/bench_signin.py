"""Benchmark what failed sign-ins cost everyone else: API latency under a login flood.

Starts `radixchat serve` on a loopback port with a fresh SQLite file holding alice (a known
password, the store's real scrypt cost) and an API key of hers, and times small API
requests (non-streaming chats, max_tokens 8, one after another):
  (a) idle;
  (b) while --attackers clients send wrong passwords for alice to the page's POST /login
      (form fields username and password, as Gradio's login form sends them), each again
      as soon as it is answered, all from one address;
  (c) the same, the names spread over --names user names that don't exist (a miss burns
      a hash too), still from one address;
  (d) with --many-addresses: as (c), each attacker from its own loopback source address
      (127.0.0.2, 127.0.0.3, ...: still to 127.0.0.1), so only the per-name lockouts hold.
Each phase runs on a fresh server (the sign-in lockouts live in the server's memory) over
the same database. Prints the API latency p50/p95 of each phase and its ratio to idle
(the goal: within 2x), and how the logins were answered: 400 (the password was
hashed and was wrong) or 429 (refused during a lockout, nothing hashed).

What this owns: the two clients and the figures; the server, alice and her key come from the
project's CLI and core.store. The API requests are timed in this process's main thread; the
attackers run in a child process's event loop, so their client work never holds the GIL
against the thread that times. Traffic to 127.0.0.1 only, bounded by --requests and
--duration.

    python -m loadtests.bench_signin [--model PATH | --random-dim 512 --random-layers 8]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from loadtests.benchmodel import add_model_args, resolve_model
from loadtests.figures import pct
from radixchat.core.store import Store
from tests.support.procs import free_port, start_radixchat, stop_process

PASSWORD = "correct horse battery staple"


# ---- the attackers, in a child process ---------------------------------------------------


def attack(
    url: str, attackers: int, names: int, many_addresses: bool, pause: float, limit_s: float, seed: int, stop, results
) -> None:
    """Child process: wrong logins from `attackers` clients until `stop` (or `limit_s`)."""
    results.put(asyncio.run(_attack(url, attackers, names, many_addresses, pause, limit_s, seed, stop)))


async def _attack(url, attackers, names, many_addresses, pause, limit_s, seed, stop) -> dict:
    answers: Counter = Counter()
    t_start = time.time()

    async def attacker(w: int) -> None:
        rng = random.Random(seed * 1000 + w)
        # its own source address, or the one every attacker shares
        transport = httpx.AsyncHTTPTransport(local_address=f"127.0.0.{2 + w % 250}" if many_addresses else None)
        async with httpx.AsyncClient(base_url=url, transport=transport, timeout=limit_s) as http:
            n = 0
            while not stop.is_set():
                name = "alice" if names <= 0 else f"guess{rng.randrange(names)}"
                n += 1
                try:
                    r = await http.post("/login", data={"username": name, "password": f"wrong-{w}-{n}"})
                    answers[str(r.status_code)] += 1
                except httpx.HTTPError as e:
                    answers[type(e).__name__] += 1
                    await asyncio.sleep(0.2)
                if pause:
                    await asyncio.sleep(pause)

    tasks = [asyncio.create_task(attacker(w)) for w in range(attackers)]
    end = time.time() + limit_s
    while not stop.is_set() and time.time() < end:
        await asyncio.sleep(0.05)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"answers": dict(answers), "seconds": time.time() - t_start}


# ---- the timed API requests, in the main thread -------------------------------------------


def api_latencies(url: str, key: str, args) -> list[float | None]:
    """Sequential small chats; None for one that failed."""
    out: list[float | None] = []
    deadline = time.perf_counter() + args.duration
    with httpx.Client(base_url=url, timeout=args.duration + 60, headers={"Authorization": f"Bearer {key}"}) as http:
        for i in range(args.requests):
            if time.perf_counter() > deadline:
                break
            body = {
                "model": "default",
                "max_tokens": 8,
                "temperature": 0,
                "messages": [{"role": "user", "content": f"({i}) What does str.split do?"}],
            }
            t0 = time.perf_counter()
            try:
                ok = http.post("/v1/chat/completions", json=body).status_code == 200
            except httpx.HTTPError:
                ok = False
            out.append(time.perf_counter() - t0 if ok else None)
            time.sleep(args.gap)
    return out


def phase(
    model: str, db: Path, key: str, work: Path, name: str, args, names: int | None = None, many_addresses: bool = False
) -> dict:
    """One fresh server: a warm-up request, the attack (unless `names` is None) given
    --settle seconds to get going, then the timed requests."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = work / f"server-{name}.log"
    server = start_radixchat(model, db, port, log)
    ctx = mp.get_context("spawn")
    stop, results = ctx.Event(), ctx.Queue()
    child, answers = None, None
    try:
        args_one = argparse.Namespace(**{**vars(args), "requests": 1, "gap": 0})
        api_latencies(url, key, args_one)  # warm-up: the first request pays for lazy set-up
        if names is not None:
            child = ctx.Process(
                target=attack,
                daemon=True,
                args=(
                    url,
                    args.attackers,
                    names,
                    many_addresses,
                    args.attack_pause,
                    args.duration + args.settle + 60,
                    args.seed,
                    stop,
                    results,
                ),
            )
            child.start()
            time.sleep(args.settle)
        lat = api_latencies(url, key, args)
        if child is not None:
            stop.set()
            answers = results.get(timeout=120)
            child.join(30)
    finally:
        stop.set()
        if child is not None and child.is_alive():
            child.terminate()
        stop_process(server)
    ok = [x for x in lat if x is not None]
    # the server logs every password it hashed and found wrong, including those whose
    # client was gone by then (a sign-in in the hashing queue runs to its end)
    hashed = log.read_text().count("failed sign-in for")
    return {
        "n": len(lat),
        "errors": len(lat) - len(ok),
        "p50": pct(ok, 0.5),
        "p95": pct(ok, 0.95),
        "answers": answers,
        "hashed": hashed,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--requests", type=int, default=15, help="timed API requests per phase")
    p.add_argument("--gap", type=float, default=0.5, help="pause between timed requests, seconds")
    p.add_argument("--attackers", type=int, default=40, help="concurrent wrong logins")
    p.add_argument(
        "--attack-pause", type=float, default=0.0, help="an attacker's pause after each answer, seconds (0: hammer)"
    )
    p.add_argument("--names", type=int, default=1000, help="user names the spread attack guesses")
    p.add_argument(
        "--many-addresses",
        action="store_true",
        help="add phase (d): the spread attack from one loopback address per attacker",
    )
    p.add_argument("--settle", type=float, default=3.0, help="seconds of attack before the first timed request")
    p.add_argument("--duration", type=float, default=120.0, help="most seconds of timed requests per phase")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    model = resolve_model(args)

    work = Path(tempfile.mkdtemp(prefix="bench-signin-"))
    db = work / "signin.db"
    with Store(db) as store:
        key = store.create_api_key(store.create_user("alice", PASSWORD), "bench")[1]
    print(f"model {model}; {time.strftime('%Y-%m-%d %H:%M')}; server logs in {work}")
    print(
        f"{args.requests} sequential API chats (max_tokens 8, {args.gap} s apart) per phase; "
        f"{args.attackers} attackers, {args.settle} s head start; a fresh server per phase"
    )
    phases = [
        ("(a) idle", {}),
        (f"(b) {args.attackers} x alice, 1 address", {"names": 0}),
        (f"(c) {args.attackers} x {args.names} names, 1 address", {"names": args.names}),
    ]
    if args.many_addresses:
        phases.append(
            (
                f"(d) {args.attackers} x {args.names} names, {min(args.attackers, 250)} addresses",
                {"names": args.names, "many_addresses": True},
            )
        )
    rows = [(name, phase(model, db, key, work, name[:3].strip("()"), args, **kw)) for name, kw in phases]

    idle = rows[0][1]
    print(
        f"\n{'API latency, s':>40} {'n':>4} {'err':>4} {'p50':>7} {'p95':>7} {'p50/idle':>9} {'p95/idle':>9}"
        f" {'answered':>9} {'400':>6} {'429':>6} {'other':>6} {'per s':>7} {'hashed':>7}"
    )
    for name, r in rows:
        line = (
            f"{name:>40} {r['n']:>4} {r['errors']:>4} {r['p50']:>7.3f} {r['p95']:>7.3f} "
            f"{r['p50'] / idle['p50']:>8.2f}x {r['p95'] / idle['p95']:>8.2f}x"
        )
        if r["answers"] is not None:
            a = Counter(r["answers"]["answers"])
            total = sum(a.values())
            other = total - a["400"] - a["429"]
            line += (
                f" {total:>9} {a['400']:>6} {a['429']:>6} {other:>6} "
                f"{total / r['answers']['seconds']:>7.1f} {r['hashed']:>7}"
            )
        print(line)
    worst = max(r["p95"] / idle["p95"] for _, r in rows[1:])
    print(f"worst p95 under a login flood / idle: {worst:.2f}x (the goal: within 2x)")
    print(
        "answered: logins answered before the attack stopped (400: hashed and wrong; 429: refused "
        "in a lockout, nothing hashed; per s over the whole attack); hashed: wrong passwords the "
        "server hashed, from its log, including those whose client had gone"
    )


if __name__ == "__main__":
    main()
