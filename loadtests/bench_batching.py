"""Benchmark: aggregate decode tokens/s with N concurrent streams against 1 stream.

Runs the engine in-process on one model (the bundled one by default, or a random-weight
llama built with a fixed seed) and, for each concurrency, submits that many requests at
once and measures generated tokens over wall time, from the first token to the last.
Prints a table and the ratio to one stream (goal for 8 streams: >= 4x). Medians of
--repeats runs. On Linux it first re-executes itself with OpenBLAS (core.platform.blas).

    python -m loadtests.bench_batching [--model PATH | --random-dim 512 --random-layers 8]
"""

from __future__ import annotations

import argparse
import statistics

from loadtests.benchmodel import add_model_args, resolve_model
from radixchat.core.config import Settings
from radixchat.core.platform.blas import active_blas, reexec_with_openblas
from radixchat.core.seam.requests import ChatRequest


def one_round(engine, n: int, max_tokens: int, temperature: float = 0.0) -> tuple[float, int]:
    """Submit n requests at once; return (aggregate decode tok/s, tokens generated)."""
    reqs = [
        ChatRequest(
            messages=[{"role": "user", "content": f"Explain Python topic number {i}."}],
            sampling={"max_tokens": max_tokens, "temperature": temperature, "seed": i, "ignore_eos": True},
        )
        for i in range(n)
    ]
    handles = [engine.submit(r) for r in reqs]
    finals = [h.result() for h in handles]
    firsts = [f.usage.ttft_ms for f in finals]
    ends = [f.usage.total_ms for f in finals]
    tokens = sum(f.usage.generated_tokens - 1 for f in finals)  # the first token is prefill's
    span_s = (max(ends) - min(firsts)) / 1e3
    return tokens / span_s, tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--streams", default="1,2,4,8")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0 samples a batch in one argmax; above 0 each request samples on its own",
    )
    args = p.parse_args()
    reexec_with_openblas("auto")

    from radixchat.core.engine.engine import Engine

    model = resolve_model(args)
    streams = [int(s) for s in args.streams.split(",")]
    engine = Engine(
        Settings(model=model, max_batch=max(streams), max_prefill_batch=max(streams), max_tokens=args.max_tokens)
    ).start()
    m = engine.loaded
    print(f"model {model}: {m.num_params / 1e6:.1f}M params, {m.dtype}; blas {active_blas()}")
    # every request generates exactly max_tokens (ignore_eos), so each round does equal work
    one_round(engine, 2, 8)  # warm-up
    rows = []
    for n in streams:
        runs = [one_round(engine, n, args.max_tokens, args.temperature) for _ in range(args.repeats)]
        tps = statistics.median(r[0] for r in runs)
        rows.append((n, tps, statistics.median(r[1] for r in runs)))
    base = rows[0][1]
    print(f"{'streams':>8} {'tokens':>8} {'agg tok/s':>10} {'per stream':>11} {'vs 1':>6}")
    for n, tps, tokens in rows:
        print(f"{n:>8} {tokens:>8.0f} {tps:>10.1f} {tps / n:>11.1f} {tps / base:>5.2f}x")
    engine.stop()


if __name__ == "__main__":
    main()
