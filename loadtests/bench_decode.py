"""Benchmark the raw batched decode ceiling: mlx-lm's functions against core.engine.step.cpu_ops.

For each batch size, one model, one K/V cache of --context tokens per row, and a bare greedy
decode loop (no scheduler, no HTTP): rounds of --steps steps with mlx-lm's attention and SwiGLU,
then the same with radixchat's CPU forms (`--cpu-ops`), alternating so both see the same
machine. Prints tok/s of each and their ratio, and checks that both pick the same tokens.
These are the ceilings bench_vs_mlxlm compares servers' end-to-end output with.

With --widths it measures instead what speculative decoding (core.engine.step.speculate) pays: a
forward of W tokens per row (a current token and W-1 drafts) against a one-token forward, per
batch size, with radixchat's CPU forms.

With --graph it measures what `mx.compile` could save on the CPU: the share of a decode step
spent building its graph in Python (all a compiled step would skip), and the elementwise parts
radixchat's CPU forms run (base-2 softmax, SwiGLU) compiled against as they are (MLX fuses a
compiled function's elementwise ops into one C++ kernel it builds with g++).

On Linux it first re-executes itself with OpenBLAS (core.platform.blas).

    python -m loadtests.bench_decode [--model tiny] [--batches 1,8,32,64] [--context 300]
    python -m loadtests.bench_decode --widths 1,2,3,4 [--batches 1,8,32] [--context 400]
    python -m loadtests.bench_decode --graph [--batches 1,8,32,64] [--context 400]
"""

from __future__ import annotations

import argparse
import statistics
import time

from loadtests.benchmodel import add_model_args, resolve_model
from radixchat.core.platform.blas import active_blas, reexec_with_openblas


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


def graph(model, batches: list[int], context: int, steps: int, rounds: int) -> None:
    """Per batch size: ms building a decode step's graph, ms evaluating it; then the CPU forms'
    elementwise work at that batch's shapes, compiled (shapeless, so no retrace as T grows) and not."""
    import mlx.core as mx

    from radixchat.core.engine.step import cpu_ops

    def timed(fn, *args) -> float:
        mx.eval(fn(*args))
        ts = []
        for _ in range(steps * rounds):
            t0 = time.perf_counter()
            mx.eval(fn(*args))
            ts.append(time.perf_counter() - t0)
        return 1000 * statistics.median(ts)

    cfg = model.args
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    print("| batch | build ms | eval ms | build share | softmax ms: as is / compiled | SwiGLU ms: as is / compiled |")
    print("|---|---|---|---|---|---|")
    for batch in batches:
        cache = prefilled(model, batch, context)
        y = mx.zeros((batch, 1), dtype=mx.uint32)
        build, run = [], []
        for _ in range(steps * rounds):
            t0 = time.perf_counter()
            out = mx.argmax(model(y, cache=cache)[:, -1:, :], axis=-1)
            t1 = time.perf_counter()
            mx.eval(out)
            build.append(t1 - t0)
            run.append(time.perf_counter() - t1)
            y = out
        b, e = 1000 * statistics.median(build), 1000 * statistics.median(run)
        scores = mx.random.normal((batch, kv, heads // kv, 1, context)) * 3
        gate, up = (
            mx.random.normal((batch, 1, cfg.intermediate_size)),
            mx.random.normal((batch, 1, cfg.intermediate_size)),
        )
        sm = (timed(cpu_ops.softmax2, scores), timed(mx.compile(cpu_ops.softmax2, shapeless=True), scores))
        sw = (timed(cpu_ops.swiglu, gate, up), timed(mx.compile(cpu_ops.swiglu, shapeless=True), gate, up))
        print(
            f"| {batch} | {b:.1f} | {e:.1f} | {b / (b + e):.1%} | {sm[0]:.2f} / {sm[1]:.2f} | "
            f"{sw[0]:.2f} / {sw[1]:.2f} |",
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(p)
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--context", type=int, default=300, help="tokens in each row's cache")
    p.add_argument("--steps", type=int, default=8, help="decode steps per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each, alternating")
    p.add_argument("--widths", default="", help="e.g. 1,2,4: time forwards of that many tokens per row instead")
    p.add_argument("--graph", action="store_true", help="time graph building and compiled elementwise ops instead")
    args = p.parse_args()
    reexec_with_openblas()
    import mlx.core as mx

    from radixchat.core.engine.step import cpu_ops
    from radixchat.core.models.model import load_model

    path = resolve_model(args)
    model = load_model(path).model
    print(f"model {path}; BLAS {active_blas()}; context {args.context}, {args.steps} steps x {args.rounds} rounds")
    cpu_ops.install(model)
    if args.graph:
        cpu_ops.use_here(True)
        graph(model, [int(b) for b in args.batches.split(",")], args.context, args.steps, args.rounds)
        return
    if args.widths:
        cpu_ops.use_here(True)
        widths(
            model,
            [int(b) for b in args.batches.split(",")],
            [int(w) for w in args.widths.split(",")],
            args.context,
            args.steps,
            args.rounds,
        )
        return
    print("| batch | mlx-lm ops tok/s | --cpu-ops tok/s | ratio | same tokens |")
    print("|---|---|---|---|---|")
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
        print(
            f"| {batch} | {tps[False]:.1f} | {tps[True]:.1f} | {tps[True] / tps[False]:.2f}x | "
            f"{'yes' if last[True] == last[False] else 'no'} |",
            flush=True,
        )
    cpu_ops.use_here(False)


if __name__ == "__main__":
    main()
