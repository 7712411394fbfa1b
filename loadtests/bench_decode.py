"""Benchmark the raw batched decode ceiling: mlx-lm's functions against core.engine.cpu_ops.

For each batch size, one model, one K/V cache of --context tokens per row, and a bare greedy
decode loop (no scheduler, no HTTP): rounds of --steps steps with mlx-lm's attention and SwiGLU,
then the same with radixchat's CPU forms (`--cpu-ops`), alternating so both see the same
machine. Prints tok/s of each and their ratio, and checks that both pick the same tokens.
These are the ceilings bench_vs_mlxlm compares servers' end-to-end output with.

With --widths it measures instead what speculative decoding (core.engine.speculate) pays: a
forward of W tokens per row (a current token and W-1 drafts) against a one-token forward, per
batch size, with radixchat's CPU forms.

On Linux it first re-executes itself with OpenBLAS (core.platform.blas).

    python -m loadtests.bench_decode [--model tiny] [--batches 1,8,32,64] [--context 300]
    python -m loadtests.bench_decode --widths 1,2,3,4 [--batches 1,8,32] [--context 400]
"""

from __future__ import annotations

import argparse
import statistics
import time

from core.platform.blas import active_blas, reexec_with_openblas
from loadtests.benchmodel import add_model_args, resolve_model


def prefilled(model, batch: int, context: int):
    """A plain K/V cache whose every row holds the same `context` tokens (prefilled once)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    x = mx.array([[(i * 7) % 500 + 10 for i in range(context)]])
    mx.eval(model(x, cache=cache))
    for c in cache:
        c.keys, c.values = mx.repeat(c.keys, batch, axis=0), mx.repeat(c.values, batch, axis=0)
    mx.eval([(c.keys, c.values) for c in cache])
    return cache


def decode(model, cache, y, steps: int):
    """`steps` greedy steps from tokens y (batch, 1); returns (seconds, the last tokens)."""
    import mlx.core as mx

    t0 = time.perf_counter()
    for _ in range(steps):
        y = mx.argmax(model(y, cache=cache)[:, -1:, :], axis=-1)
        mx.eval(y)
    return time.perf_counter() - t0, y


def widths(model, batches: list[int], ws: list[int], context: int, steps: int, rounds: int) -> None:
    """ms per forward of w tokens per row, and its ratio to a one-token forward (each
    forward's extra tokens trimmed again, so every one sees the same context)."""
    import mlx.core as mx

    print("| batch | tokens per row | ms per forward | x a one-token forward |")
    print("|---|---|---|---|")
    for batch in batches:
        ms: dict[int, float] = {}
        for w in ws:
            times = []
            for _ in range(rounds):
                cache = prefilled(model, batch, context)
                x = mx.zeros((batch, w), dtype=mx.uint32)
                t0 = time.perf_counter()
                for _ in range(steps):
                    mx.eval(mx.argmax(model(x, cache=cache), axis=-1))
                    for c in cache:
                        c.trim(w - 1)
                times.append((time.perf_counter() - t0) / steps)
            ms[w] = 1000 * statistics.median(times)
            print(f"| {batch} | {w} | {ms[w]:.0f} | {ms[w] / ms[ws[0]]:.2f}x |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(p)
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--context", type=int, default=300, help="tokens in each row's cache")
    p.add_argument("--steps", type=int, default=8, help="decode steps per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each, alternating")
    p.add_argument("--widths", default="", help="e.g. 1,2,4: time forwards of that many tokens per row instead")
    args = p.parse_args()
    reexec_with_openblas()
    import mlx.core as mx

    from core.engine import cpu_ops
    from core.engine.model import load_model

    path = resolve_model(args)
    model = load_model(path).model
    print(f"model {path}; BLAS {active_blas()}; context {args.context}, {args.steps} steps x {args.rounds} rounds")
    print("| batch | mlx-lm ops tok/s | --cpu-ops tok/s | ratio | same tokens |")
    print("|---|---|---|---|---|")
    cpu_ops.install(model)
    if args.widths:
        cpu_ops.use_here(True)
        widths(model, [int(b) for b in args.batches.split(",")], [int(w) for w in args.widths.split(",")],
               args.context, args.steps, args.rounds)
        return
    for batch in [int(b) for b in args.batches.split(",")]:
        times: dict[bool, list[float]] = {False: [], True: []}
        last: dict[bool, list] = {}
        for _ in range(args.rounds):
            for on in (False, True):
                cpu_ops.use_here(on)
                cache = prefilled(model, batch, args.context)
                seconds, y = decode(model, cache, mx.zeros((batch, 1), dtype=mx.uint32), args.steps)
                times[on].append(seconds)
                last[on] = y.tolist()
        tps = {on: batch * args.steps / statistics.median(t) for on, t in times.items()}
        print(f"| {batch} | {tps[False]:.1f} | {tps[True]:.1f} | {tps[True] / tps[False]:.2f}x | "
              f"{'yes' if last[True] == last[False] else 'no'} |", flush=True)
    cpu_ops.use_here(False)


if __name__ == "__main__":
    main()
