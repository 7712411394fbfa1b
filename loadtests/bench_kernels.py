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
after a short warm-up run (OpenBLAS preloaded on Linux, as the server runs); the engine's generator here is the step without the engine's
loop around it (bench_host times that).
"""

from __future__ import annotations

import argparse
import io
import re
from collections import Counter

from loadtests.benchmodel import add_model_args, resolve_model
from radixchat.core.platform.blas import reexec_with_openblas

# primitives that make a view or a broadcast rather than run a kernel of their own on a GPU
VIEWS = frozenset({"Broadcast", "Slice", "Reshape", "ExpandDims", "Squeeze", "Transpose", "AsStrided", "Flatten"})
_LABEL = re.compile(r'label ="([^"]+)", shape=rectangle')


class Count:
    """While entered, every mx.eval / mx.async_eval has its unevaluated primitives counted."""

    def __init__(self):
        self.names: Counter[str] = Counter()
        self.evals = 0

    def _count(self, args) -> None:
        import mlx.core as mx
        from mlx.utils import tree_flatten

        arrays = [v for _, v in tree_flatten(list(args)) if isinstance(v, mx.array)]
        if not arrays:
            return
        dot = io.StringIO()
        mx.export_to_dot(dot, *arrays)
        found = [m.split("\n")[0].split(" ")[0] for m in _LABEL.findall(dot.getvalue())]
        self.names.update(found)
        self.evals += bool(found)  # an eval of what is already evaluated waits for nothing

    def __enter__(self) -> Count:
        import mlx.core as mx

        self._real_eval, self._real_async = mx.eval, mx.async_eval

        def counted(*args):
            self._count(args)
            self._real_eval(*args)

        mx.eval = mx.async_eval = counted
        return self

    def __exit__(self, *exc) -> None:
        import mlx.core as mx

        mx.eval, mx.async_eval = self._real_eval, self._real_async

    def total(self, compute_only: bool = False) -> int:
        return sum(n for name, n in self.names.items() if not (compute_only and name in VIEWS))


def _prompts(rows: int, length: int, vocab: int) -> list[list[int]]:
    import random

    rng = random.Random(0)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(rows)]


def _decoding(gen, rows: int, warm: int) -> None:
    """Step until every row decodes (nothing waits or prefills), then `warm` steps more."""
    for _ in range(10_000):
        batch = gen._generation_batch
        if len(batch) == rows and not gen._unprocessed_sequences and not gen._currently_processing:
            break
        gen.next()
    else:
        raise RuntimeError("the prompts never all reached the decoding batch")
    for _ in range(warm):
        gen.next()


def count_steps(gen, prompts: list[list[int]], steps: int, max_tokens: int) -> Count:
    gen.insert(prompts, max_tokens=[max_tokens] * len(prompts))
    _decoding(gen, len(prompts), warm=3)
    with Count() as c:
        for _ in range(steps):
            gen.next()
    if len(gen._generation_batch) != len(prompts):
        raise RuntimeError("a row left while counting: raise --max-tokens")
    return c


def count_churn(gen, prompts: list[list[int]], steps: int) -> Count:
    """Rows that leave and join: row k of the first batch stops after k + 4 tokens, and each
    row that stops is replaced by a new prompt that stops `len(prompts)` tokens later, so about
    one row leaves and one joins a step; the count covers every step's prefill, joins, leaves
    and decode."""
    rows = len(prompts)
    gen.insert(prompts, max_tokens=[k + 4 for k in range(rows)])
    more = iter(prompts * (steps + rows))
    with Count() as c:
        for _ in range(steps):
            _, finished = gen.next()
            done = sum(r.finish_reason is not None for r in finished)
            if done:
                gen.insert([next(more) for _ in range(done)], max_tokens=[rows] * done)
    return c


def time_steps(gen, prompts: list[list[int]], steps: int, tokens: int) -> tuple[float, float]:
    """Output tokens/s of (`steps` decode steps once every row decodes; the whole run of
    every row's prompt and `tokens` tokens), the device's work waited for at each end."""
    import time

    import mlx.core as mx

    rows = len(prompts)
    gen.insert(prompts, max_tokens=[1000] * rows)
    _decoding(gen, rows, warm=3)
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


def library(model, rows: int):
    from mlx_lm.generate import BatchGenerator

    return BatchGenerator(model, completion_batch_size=rows, prefill_batch_size=rows)


STEP_TOKENS = {"value": None}  # --step-tokens (None: the server's default)


def engine(model, rows: int):
    """The generator the engine builds (core.engine.stepper.make_generator), its settings the
    server's defaults but the batch's size (and --step-tokens); every row greedy, as the library's."""
    import mlx.core as mx

    from radixchat.core.config import Settings
    from radixchat.core.engine.stepper import make_generator

    step = {} if STEP_TOKENS["value"] is None else {"step_tokens": STEP_TOKENS["value"]}
    settings = Settings(max_batch=rows, speculate=0, **step)
    return make_generator(model, settings, mx.new_stream(mx.default_device()), lambda responses: None, 0)


def both(model, rows: int, measure) -> tuple:
    """`measure(gen)` of a fresh engine's generator, then of a fresh library's, each on its stream."""
    import mlx.core as mx

    got = []
    for make in (engine, library):
        gen = make(model, rows)
        with mx.stream(gen.stream):
            got.append(measure(gen))
        gen.close()
    return tuple(got)


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
    STEP_TOKENS["value"] = args.step_tokens
    import mlx.core as mx
    from mlx_lm import load

    from radixchat.core.engine import cpu_ops, unnormalized

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
        prompts = _prompts(rows, args.prompt, vocab)
        if args.churn:
            e, lib = both(model, rows, lambda gen, p=prompts: count_churn(gen, p, args.steps))
        else:
            e, lib = both(model, rows, lambda gen, p=prompts: count_steps(gen, p, args.steps, max_tokens))
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
            prompts = _prompts(rows, args.prompt, vocab)

            def timed(gen, prompts=prompts):
                time_steps(gen, prompts[:1], 4, 4)  # a warm-up of the shapes' first kernels
                return time_steps(gen, prompts, args.steps, args.tokens)

            (ed, ew), (ld, lw) = both(model, rows, timed)
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
