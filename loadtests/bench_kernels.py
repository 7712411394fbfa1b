"""The primitives a decode step submits: the engine's generator against mlx-lm's own
`BatchGenerator`, the same model, rows and prompts, counted on any device (the CPU too).

On a GPU a decode step of a small model is a few milliseconds, and building and launching its
kernels (`mx.async_eval`) was the largest part of it on the H200 (../shared/gpu/README.md). A
count of what a step hands MLX moves when that work does, without a GPU at hand: every
`mx.eval` and `mx.async_eval` a step calls is intercepted, the graph it was given is read with
`mx.export_to_dot`, and each primitive in it that is not yet evaluated is counted by name.
Arrays already evaluated are inputs there, not counted again; an `async_eval` runs as a plain
`eval` while counting, so a step's graph in flight is not counted twice. Evaluations a step
forces implicitly (`.tolist()`, `.item()` of an unevaluated array) are not seen: the engine's
and the library's steps make theirs explicit first.

Counted: `--steps` decode steps of `--rows` rows, after every row's prompt (`--prompt` random
tokens) is prefilled and a few steps have run, no row joining or leaving; with `--churn`,
steps in which about one row leaves and one joins (the chat regime: each step's prefill,
joins and leaves counted too). Printed per step:
the primitives, those that compute (views such as Slice, Reshape, Broadcast left out: no
kernel of their own on a GPU), the evaluations (each a wait for the device), and the ratio
engine / library; `--by-name` adds each primitive's count. The engine runs as its thread
does (`unnormalized`, and `cpu_ops` with `--cpu-ops`: the CPU's forms, which a GPU never
takes; left off by default, so the count is the GPU's graph).

    python -m loadtests.bench_kernels [--model tiny | --random-dim 2048 --random-layers 16]
        [--rows 1,32,64] [--prompt 200] [--steps 8] [--churn] [--cpu-ops] [--by-name]
        [--speed [--tokens 128] [--step-tokens N]]

`--speed` also times both, uncounted: `--steps` decode steps once every row decodes, and a
whole run (every row's prompt, then `--tokens` tokens, no stop tokens), output tokens/s each,
after a short warm-up run (OpenBLAS preloaded on Linux, as the server runs); the engine's
generator here is the step without the engine's loop around it (bench_host times that).
The counting itself lives in tests/support/step_count.py (tests/test_step_primitives.py
holds its counts as invariants).
"""

from __future__ import annotations

import argparse

from loadtests.benchmodel import add_model_args, resolve_model
from radixchat.core.platform.blas import reexec_with_openblas
from tests.support.step_count import both, count_churn, count_steps, decoding, random_prompts


def time_steps(gen, prompts: list[list[int]], steps: int, tokens: int) -> tuple[float, float]:
    """Output tokens/s of (`steps` decode steps once every row decodes; the whole run of
    every row's prompt and `tokens` tokens), the device's work waited for at each end."""
    import time

    import mlx.core as mx

    rows = len(prompts)
    gen.insert(prompts, max_tokens=[1000] * rows)
    decoding(gen, rows, warm=3)
    mx.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        gen.next()
    mx.synchronize()
    decode = rows * steps / (time.perf_counter() - t0)
    gen.remove(list(gen._generation_batch.uids))
    t0, done = time.perf_counter(), 0
    gen.insert(prompts, max_tokens=[tokens] * rows)
    while done < rows:
        done += sum(r.finish_reason is not None for r in gen.next()[1])
    mx.synchronize()
    return decode, rows * tokens / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(p)
    p.set_defaults(model="tiny")
    p.add_argument("--rows", default="1,32,64", help="comma-separated batch sizes")
    p.add_argument("--prompt", type=int, default=200, help="tokens in each row's prompt")
    p.add_argument("--steps", type=int, default=8, help="decode steps counted")
    p.add_argument("--cpu-ops", action="store_true", help="the engine's CPU forms of attention, SwiGLU, RoPE")
    p.add_argument("--churn", action="store_true", help="a row leaves and one joins about every step")
    p.add_argument("--speed", action="store_true", help="also time each: decode steps and whole runs, tokens/s")
    p.add_argument("--step-tokens", type=int, default=None, help="the engine's step budget (default: the server's)")
    p.add_argument("--tokens", type=int, default=128, help="tokens a row in --speed's whole runs")
    p.add_argument("--by-name", action="store_true", help="each primitive's count a step, engine and library")
    args = p.parse_args()
    reexec_with_openblas()
    import mlx.core as mx
    from mlx_lm import load

    from radixchat.core.engine.step import cpu_ops, unnormalized

    path = resolve_model(args)
    model, _ = load(path)
    unnormalized.install()
    unnormalized.use_here(True)
    if args.cpu_ops:
        cpu_ops.install(model)
        cpu_ops.use_here(True)
    vocab = model.args.vocab_size
    max_tokens = 1000  # no row leaves while it is counted, however long the prefill took
    regime = "a row leaving and one joining about every step" if args.churn else "steady decode"
    print(f"model {path}; device {mx.default_device()}; prompts of {args.prompt} tokens; {args.steps} steps, {regime}")
    print(f"engine's ops: {'cpu_ops (the CPU forms)' if args.cpu_ops else 'the library functions (a GPU graph)'}")
    print("| rows | primitives a step: engine / library | ratio | computing (no views) | ratio | evals a step |")
    print("|---|---|---|---|---|---|")
    names = {}
    for rows in [int(r) for r in args.rows.split(",")]:
        prompts = random_prompts(rows, args.prompt, vocab)
        if args.churn:
            e, lib = both(model, rows, lambda gen, p=prompts: count_churn(gen, p, args.steps), args.step_tokens)
        else:
            e, lib = both(
                model, rows, lambda gen, p=prompts: count_steps(gen, p, args.steps, max_tokens), args.step_tokens
            )
        n = args.steps
        print(
            f"| {rows} | {e.total() / n:.0f} / {lib.total() / n:.0f} | {e.total() / lib.total():.2f}x"
            f" | {e.total(True) / n:.0f} / {lib.total(True) / n:.0f} | {e.total(True) / lib.total(True):.2f}x"
            f" | {e.evals / n:.1f} / {lib.evals / n:.1f} |"
        )
        names[rows] = (e, lib)
    if args.speed:
        print(
            f"\noutput tokens/s: {args.steps} decode steps of every row; whole runs of every prompt and {args.tokens} tokens"
        )
        print("| rows | decode: engine / library | ratio | whole run: engine / library | ratio |")
        print("|---|---|---|---|---|")
        for rows in [int(r) for r in args.rows.split(",")]:
            prompts = random_prompts(rows, args.prompt, vocab)

            def timed(gen, prompts=prompts):
                time_steps(gen, prompts[:1], 4, 4)  # a warm-up of the shapes' first kernels
                return time_steps(gen, prompts, args.steps, args.tokens)

            (ed, ew), (ld, lw) = both(model, rows, timed, args.step_tokens)
            print(f"| {rows} | {ed:,.0f} / {ld:,.0f} | {ed / ld:.2f}x | {ew:,.0f} / {lw:,.0f} | {ew / lw:.2f}x |")
    if args.by_name:
        for rows, (e, lib) in names.items():
            print(f"\n{rows} rows: primitive, engine / library a step (those that differ)")
            for name in sorted(set(e.names) | set(lib.names)):
                a, b = e.names[name] / args.steps, lib.names[name] / args.steps
                if a != b:
                    print(f"  {name:24s} {a:7.1f} / {b:7.1f}")


if __name__ == "__main__":
    main()
