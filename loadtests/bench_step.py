"""Benchmark the engine step: running streams' time per token while long prompts arrive,
and a newcomer's time to first token while a batch decodes, for several --step-tokens.

For each value of --step-tokens (0 is mlx-lm's own order: decode, then a whole prefill
step; the others are core.engine.step.stepper's budgeted step), one in-process engine on the
same model, in the same run:

1. *Arrivals*: --streams requests decode (ignore_eos) while --long prompts of
   --long-tokens tokens (each unique, so none hits the prefix cache) arrive --gap seconds
   apart. Prints the running streams' gaps between tokens over that window (TPOT p50, p95,
   max) and the long prompts' time to first token.
2. *Newcomer*: --turns short chat turns (a seed-scenario system prompt and question), one
   at a time, first with the server idle, then while --streams requests decode. Prints
   their TTFT p50/p95 and the ratio under load to idle (the fairness goal: p95
   within 2x).

On Linux it first re-executes itself with OpenBLAS (core.platform.blas). In-process, so
the figures are the engine's alone: no HTTP, no second process on the cores.

    python -m loadtests.bench_step [--model tiny] [--compare 0,256,512,1024]
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time

from loadtests.benchmodel import add_model_args, resolve_model
from loadtests.figures import pct
from radixchat import assets
from radixchat.core.config import Settings
from radixchat.core.platform.blas import active_blas, reexec_with_openblas
from radixchat.core.seam.requests import ChatRequest, TextDelta

PROMPTS = assets.prompts()
SYSTEMS = [s["text"] for s in PROMPTS["system_prompts"]]
QUESTIONS = PROMPTS["questions"]
WORDS = [
    "river",
    "stone",
    "lamp",
    "orbit",
    "garden",
    "copper",
    "violin",
    "meadow",
    "engine",
    "harbor",
    "lantern",
    "quartz",
    "pepper",
    "canyon",
    "marble",
    "thunder",
    "saddle",
    "velvet",
    "glacier",
    "tulip",
]


class Stream:
    """One request read in a thread of its own, with the time of every text delta."""

    def __init__(self, engine, request: ChatRequest):
        self.t_submit = time.perf_counter()
        self.handle = engine.submit(request)
        self.times: list[float] = []
        self.final = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for ev in self.handle:
            if isinstance(ev, TextDelta):
                self.times.append(time.perf_counter())
            else:
                self.final = ev

    @property
    def ttft(self) -> float:
        return self.times[0] - self.t_submit if self.times else float("nan")


def decoding(engine, n: int, max_tokens: int) -> list[Stream]:
    out = [
        Stream(
            engine,
            ChatRequest(
                messages=[{"role": "user", "content": f"Tell a long story about item {i}."}],
                sampling={"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
            ),
        )
        for i in range(n)
    ]
    while any(not s.times for s in out):
        time.sleep(0.01)
    return out


def stop_all(streams: list[Stream]) -> None:
    for s in streams:
        s.handle.cancel()
    for s in streams:
        s.thread.join()


def long_prompt(rng: random.Random, n_words: int, tag: int) -> str:
    return f"[{tag}] " + " ".join(rng.choice(WORDS) for _ in range(n_words))


def arrivals(engine, args, rng: random.Random) -> dict:
    running = decoding(engine, args.streams, args.stream_tokens)
    t0 = time.perf_counter()
    longs = []
    for _i in range(args.long):
        longs.append(
            Stream(
                engine,
                ChatRequest(
                    messages=[{"role": "user", "content": long_prompt(rng, args.long_tokens, rng.randrange(10**9))}],
                    sampling={"max_tokens": 8, "temperature": 0, "ignore_eos": True},
                ),
            )
        )
        time.sleep(args.gap)
    for s in longs:
        s.thread.join()
    t1 = time.perf_counter()
    stop_all(running)
    gaps = [b - a for s in running for a, b in zip(s.times, s.times[1:]) if t0 <= a and b <= t1]
    return {
        "tpot_p50": pct(gaps, 0.5),
        "tpot_p95": pct(gaps, 0.95),
        "tpot_max": max(gaps, default=float("nan")),
        "long_ttft_p50": pct([s.ttft for s in longs], 0.5),
        "long_ttft_p95": pct([s.ttft for s in longs], 0.95),
        "long_tokens": statistics.mean(s.handle.prompt_tokens for s in longs),
    }


def turns(engine, args, rng: random.Random, tag: str) -> list[float]:
    out = []
    for i in range(args.turns):
        s = Stream(
            engine,
            ChatRequest(
                messages=[
                    {"role": "system", "content": rng.choice(SYSTEMS)},
                    {"role": "user", "content": f"[{tag}{i}] {rng.choice(QUESTIONS)}"},
                ],
                sampling={"max_tokens": 4, "temperature": 0},
            ),
        )
        s.thread.join()
        out.append(s.ttft)
        time.sleep(args.think)
    return out


def newcomer(engine, args, rng: random.Random) -> dict:
    turns(engine, args, rng, "warm")  # the system prompts into the prefix cache
    alone = turns(engine, args, rng, "alone")
    running = decoding(engine, args.streams, args.stream_tokens)
    loaded = turns(engine, args, rng, "busy")
    stop_all(running)
    return {
        "alone_p50": pct(alone, 0.5),
        "alone_p95": pct(alone, 0.95),
        "busy_p50": pct(loaded, 0.5),
        "busy_p95": pct(loaded, 0.95),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--compare", default="0,512", help="--step-tokens values to run, comma-separated")
    p.add_argument("--streams", type=int, default=32, help="requests decoding meanwhile")
    p.add_argument(
        "--stream-tokens",
        type=int,
        default=400,
        help="each decoding request's length: enough to outlast a phase (they are then "
        "cancelled), small enough that the K/V budget admits them all at once",
    )
    p.add_argument("--long", type=int, default=6, help="long prompts arriving")
    p.add_argument("--long-tokens", type=int, default=1000, help="about this many words each")
    p.add_argument("--gap", type=float, default=0.5, help="seconds between long prompts")
    p.add_argument("--turns", type=int, default=12, help="newcomer turns, idle and busy each")
    p.add_argument("--think", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    reexec_with_openblas("auto")

    from radixchat.core.engine.engine import Engine

    model = resolve_model(args)
    rows = []
    for budget in [int(v) for v in args.compare.split(",")]:
        engine = Engine(Settings(model=model, step_tokens=budget, max_tokens=64)).start()
        if not rows:
            m = engine.loaded
            print(
                f"model {model}: {m.num_params / 1e6:.1f}M params, {m.dtype}; blas {active_blas()}; "
                f"{args.streams} streams decoding"
            )
        rng = random.Random(args.seed)  # the same prompts for every budget
        turns(engine, argparse.Namespace(turns=2, think=0), rng, "warmup")
        a = arrivals(engine, args, rng)
        print(f"step {budget}: arrivals {a}", flush=True)
        n = newcomer(engine, args, rng)
        print(f"step {budget}: newcomer {n}", flush=True)
        rows.append((budget, a, n))
        engine.stop()
    print(f"\nlong prompts: {args.long} x ~{rows[0][1]['long_tokens']:.0f} tokens, {args.gap} s apart")
    print(
        f"{'step':>6} | {'TPOT p50':>8} {'p95':>6} {'max':>6} s | {'long TTFT p50':>13} {'p95':>6} s | "
        f"{'new TTFT idle p95':>17} {'busy p50':>8} {'p95':>6} s {'p95 ratio':>9}"
    )
    for budget, a, n in rows:
        print(
            f"{budget or 'mlx-lm':>6} | {a['tpot_p50']:>8.3f} {a['tpot_p95']:>6.3f} {a['tpot_max']:>6.3f}   | "
            f"{a['long_ttft_p50']:>13.2f} {a['long_ttft_p95']:>6.2f}   | {n['alone_p95']:>17.3f} "
            f"{n['busy_p50']:>8.3f} {n['busy_p95']:>6.3f}   {n['busy_p95'] / n['alone_p95']:>8.2f}x"
        )


if __name__ == "__main__":
    main()
