"""Benchmark prompt-lookup speculative decoding (--speculate K): speed-up, acceptance, same text.

One in-process engine per run (no HTTP, a fresh prefix cache each time), --users threads each
holding one conversation of --turns turns, greedy, --max-tokens per reply, no think time; each
draft length in --drafts runs once per round, rounds interleaved so every setting sees the same
machine. Two workloads:

- chat: the seed scenario's system prompts and questions (loadtests/scenario.py's prompts);
- quote: the user pastes a short Python function and asks for a change, so the answer repeats
  most of its context (what prompt lookup is for).

Prints per workload, users and draft length: output tok/s (median over rounds), the speed-up
against --drafts' first entry (0 = off) paired within each round, the acceptance rate (accepted
/ drafted tokens) and tokens per verify step, and whether every reply was the same text as with
speculation off (greedy decoding must not change). On Linux it first re-executes itself with
OpenBLAS (core.platform.blas).

    python -m loadtests.bench_speculate [--model tiny] [--users 1,8,32] [--drafts 0,2]
        [--workloads chat,quote] [--turns 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import threading
from dataclasses import asdict

from loadtests.bench_profile import run_all
from loadtests.benchmodel import add_model_args, resolve_model
from radixchat import assets
from radixchat.core.config import Settings
from radixchat.core.platform.blas import active_blas, reexec_with_openblas
from radixchat.core.seam.requests import ChatRequest, Finished

PROMPTS = assets.prompts()
CODE = [
    "def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs)\n",
    "def is_palindrome(s):\n    s = s.lower()\n    return s == s[::-1]\n",
    "def count_words(text):\n    counts = {}\n    for word in text.split():\n        counts[word] = counts.get(word, 0) + 1\n    return counts\n",
    "def fizzbuzz(n):\n    for i in range(1, n + 1):\n        if i % 15 == 0:\n            print('FizzBuzz')\n"
    "        elif i % 3 == 0:\n            print('Fizz')\n        elif i % 5 == 0:\n            print('Buzz')\n"
    "        else:\n            print(i)\n",
    "def read_lines(path):\n    with open(path) as f:\n        return [line.strip() for line in f]\n",
]
ASKS = [
    "Add type hints to this function and show the whole function:",
    "Rename the variables to clearer names and show the whole function:",
    "Add a docstring to this function and show it:",
]


def question(workload: str, rng: random.Random) -> str:
    if workload == "chat":
        return rng.choice(PROMPTS["questions"])
    return f"{rng.choice(ASKS)}\n\n```python\n{rng.choice(CODE)}```"


def user(engine, workload: str, seed: int, turns: int, max_tokens: int, out: list) -> None:
    rng = random.Random(seed)
    messages = [{"role": "system", "content": rng.choice(PROMPTS["system_prompts"])["text"]}]
    for _ in range(turns):
        messages.append({"role": "user", "content": question(workload, rng)})
        final = engine.submit(
            ChatRequest(messages=list(messages), sampling={"max_tokens": max_tokens, "temperature": 0.0})
        ).result()
        if not isinstance(final, Finished):
            raise SystemExit(f"a request failed: {final}")
        out.append((seed, final.text, final.usage))
        messages.append({"role": "assistant", "content": final.text})


def one_run(model: str, drafts: int, workload: str, users: int, turns: int, max_tokens: int) -> dict:
    from radixchat.core.engine.engine import Engine

    engine = Engine(Settings(model=model, speculate=drafts)).start()
    try:
        out: list = []
        threads = [
            threading.Thread(target=user, args=(engine, workload, 1000 + u, turns, max_tokens, out))
            for u in range(users)
        ]
        wall = run_all(threads)
        s = engine.stats().speculation
        spec = asdict(s) if s else {}
    finally:
        engine.stop()
        del engine
        gc.collect()  # the next run's engine needs the memory this one's model and K/V held
    tokens = sum(u.generated_tokens for _, _, u in out)
    tpot = [1000 / u.decode_tps for _, _, u in out if u.decode_tps > 0]
    return {
        "tps": tokens / wall,
        "texts": sorted((s, t) for s, t, _ in out),
        "spec": spec,
        "tokens": tokens,
        "tpot": statistics.median(tpot),
        "latency": statistics.mean(u.total_ms for _, _, u in out) / 1000,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(p)
    p.add_argument("--users", default="1,8,32")
    p.add_argument("--drafts", default="0,2", help="draft lengths to compare, the first is the baseline")
    p.add_argument("--workloads", default="chat,quote")
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    reexec_with_openblas()
    model = resolve_model(args)
    ks = [int(k) for k in args.drafts.split(",")]
    print(
        f"model {model}; BLAS {active_blas()}; {args.turns} turns, max_tokens {args.max_tokens}, "
        f"greedy; {args.rounds} interleaved rounds"
    )
    print(
        "| workload | users | --speculate | output tok/s | speed-up (min-max) | TPOT p50 ms | mean latency s | "
        "acceptance | tokens per drafting row and step | verify steps | waits | same text |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for workload in args.workloads.split(","):
        for users in [int(u) for u in args.users.split(",")]:
            runs: dict[int, list[dict]] = {k: [] for k in ks}
            for _ in range(args.rounds):
                for k in ks:
                    runs[k].append(one_run(model, k, workload, users, args.turns, args.max_tokens))
            base = runs[ks[0]]
            for k in ks:
                rs = runs[k]
                ratios = [r["tps"] / b["tps"] for r, b in zip(rs, base)]
                spec = {
                    f: sum(r["spec"].get(f, 0) for r in rs)
                    for f in ("drafted", "accepted", "rows_drafting", "steps", "waits")
                }
                same = all(r["texts"] == b["texts"] for r, b in zip(rs, base))
                drafted = spec.drafted
                accepted = f"{spec['accepted'] / drafted:.0%} of {drafted}" if drafted else "-"
                per_row = f"{1 + spec['accepted'] / spec['rows_drafting']:.2f}" if spec["rows_drafting"] else "-"
                tpot = statistics.median(r["tpot"] for r in rs)
                latency = statistics.median(r["latency"] for r in rs)
                print(
                    f"| {workload} | {users} | {k} | {statistics.median(r['tps'] for r in rs):.1f} | "
                    f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | {tpot:.0f} | "
                    f"{latency:.1f} | {accepted} | {per_row} | {spec['steps']} | {spec['waits']} | {'yes' if same else 'NO'} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
