"""The host time of building a decode step's forward graph, and its op count, with each layer's
RoPE made by the library and from the step's one table (core.engine.step.cpu_ops.shared_positions).

The engine's path: --rows rows of a random past of up to --past tokens (left-padded) in slot
caches (core.cache.batch.slots), the CPU forms of core.engine.step.cpu_ops installed, one token a row a
step, each step's graph evaluated before the next is built. The two forms alternate, --runs
runs of --steps steps each; printed: the median build time of each form, their ratio, the
nodes in one step's graph, and whether the two forms' logits are equal bit for bit.
Re-executes itself with OpenBLAS on Linux (core.platform.blas).

    python -m loadtests.bench_forward [--model tiny] [--random-dim 448 --random-layers 8
        --random-arch qwen3] [--rows 32] [--past 300] [--runs 10] [--steps 40]
"""

from __future__ import annotations

import argparse
import io
import re
import statistics
import time
from contextlib import nullcontext

from loadtests.benchmodel import add_model_args, resolve_model
from radixchat.core.platform.blas import reexec_with_openblas


def decode(model, rows: int, past: int, steps: int, shared: bool) -> tuple[list[float], list, int]:
    """Build and run `steps` decode steps; (build seconds of each, logits of each, graph nodes)."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    from radixchat.core.cache.batch.slots import SlotKVCache
    from radixchat.core.engine.step import cpu_ops

    vocab = model.args.vocab_size
    mx.random.seed(0)
    pads = mx.random.randint(0, past * 2 // 3, (rows,)).tolist()
    caches = [BatchKVCache(pads) for _ in model.layers]
    model(mx.random.randint(1, vocab, (rows, past)), cache=caches)
    mx.eval([c.keys for c in caches])
    caches = [SlotKVCache.adopt(c, rows) for c in caches]
    tokens = mx.random.randint(1, vocab, (rows, 1))
    times, outs, nodes = [], [], 0
    for step in range(steps):
        t = time.perf_counter()
        with cpu_ops.shared_positions(caches) if shared else nullcontext():
            logits = model(tokens, cache=caches)[:, -1, :]
        times.append(time.perf_counter() - t)
        if step == 0:
            dot = io.StringIO()
            mx.export_to_dot(dot, logits)
            nodes = len(re.findall(r"label =", dot.getvalue()))
        tokens = mx.argmax(logits, axis=-1)[:, None]
        mx.eval(tokens, logits)
        outs.append(logits)
    return times[5:], outs, nodes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(p)
    p.set_defaults(model="tiny")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--past", type=int, default=300)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args()
    reexec_with_openblas()
    import mlx.core as mx
    from mlx_lm import load

    from radixchat.core.engine.step import cpu_ops

    path = resolve_model(args)
    model, _ = load(path)
    cpu_ops.install(model)
    cpu_ops.use_here(True)
    build = {False: [], True: []}
    same, nodes = True, {}
    for _ in range(args.runs):
        runs = {shared: decode(model, args.rows, args.past, args.steps, shared) for shared in (False, True)}
        for shared, (times, _, n) in runs.items():
            build[shared].append(statistics.median(times))
            nodes[shared] = n
        same = same and all(mx.array_equal(a, b).item() for a, b in zip(runs[False][1], runs[True][1]))
    lib, table = (1e6 * statistics.median(build[s]) for s in (False, True))
    print(f"model {path}; {args.rows} rows, past up to {args.past}; medians of {args.runs} alternating runs")
    print("| RoPE | forward graph build, us | nodes in a step's graph |")
    print("|---|---|---|")
    print(f"| the library's, each layer | {lib:.0f} | {nodes[False]} |")
    print(f"| the step's table | {table:.0f} | {nodes[True]} |")
    print(f"ratio {table / lib:.3f}; logits equal bit for bit: {same}")


if __name__ == "__main__":
    main()
