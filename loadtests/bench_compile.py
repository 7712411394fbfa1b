"""What a compiled decode forward would save the engine thread: the host time of building one
decode step's graph op by op (the model's Python, as every step does now) against calling the
same forward through `mx.compile`, and the device time of each.

Not the engine's path: the K/V here is a fixed past of --past tokens per row that each call
extends by one without keeping it (a cache whose `update_and_fetch` concatenates), so every
call has the same shapes and the compiled function traces once. The engine's slot buffers
change shape only at a re-lay, but their window moves every step; compiling the engine's step
would need the window as a mask over the whole buffer and the write position as an array
(BENCHMARKS, "Sampled rows in one call, and the prompt step's cache"). Medians of --calls
calls after a warm-up; re-executes itself with OpenBLAS on Linux (core.platform.blas).

    python -m loadtests.bench_compile [--model tiny] [--rows 32] [--past 300] [--retrace]
"""

from __future__ import annotations

import argparse
import statistics
import time

from loadtests.benchmodel import add_model_args, resolve_model
from radixchat.core.platform.blas import reexec_with_openblas


class PastOnly:
    """The K/V of a fixed past, extended by each call's token and not kept."""

    def __init__(self, keys, values):
        import mlx.core as mx

        self._mx = mx
        self.keys, self.values, self.offset = keys, values, keys.shape[2]

    def update_and_fetch(self, keys, values):
        cat = self._mx.concatenate
        return cat([self.keys, keys], axis=2), cat([self.values, values], axis=2)

    def make_mask(self, n, return_array=False, **kwargs):
        return None  # every row's past is whole: nothing to hide


def timed(forward, tokens, kv, calls: int) -> tuple[float, float]:
    """Median host (building the graph) and device (evaluating it) seconds of one call."""
    import mlx.core as mx

    for _ in range(3):
        mx.eval(forward(tokens, *kv))
    host, device = [], []
    for _ in range(calls):
        t0 = time.perf_counter()
        out = forward(tokens, *kv)
        t1 = time.perf_counter()
        mx.eval(out)
        host.append(t1 - t0)
        device.append(time.perf_counter() - t1)
    return statistics.median(host), statistics.median(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(p)
    p.set_defaults(model="tiny")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--past", type=int, default=300, help="tokens each row has before the step")
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--retrace", action="store_true", help="also time a new trace at each of 4 smaller row counts")
    args = p.parse_args()
    reexec_with_openblas()
    import mlx.core as mx

    from radixchat.core.engine.step import cpu_ops
    from radixchat.core.models.model import load_model

    model = load_model(resolve_model(args)).model
    cpu_ops.install(model)
    cpu_ops.use_here(True)  # as the engine thread runs it
    layers, a = len(model.layers), model.args
    heads, dim = a.num_key_value_heads, getattr(a, "head_dim", None) or a.hidden_size // a.num_attention_heads
    kv = [mx.random.normal((args.rows, heads, args.past, dim)) for _ in range(2 * layers)]
    mx.eval(kv)
    tokens = mx.zeros((args.rows, 1), mx.uint32)

    def forward(tokens, *kv):
        return model(tokens, cache=[PastOnly(kv[2 * i], kv[2 * i + 1]) for i in range(layers)])

    compiled = mx.compile(forward)
    print(f"{layers} layers, {args.rows} rows of {args.past} tokens; ms a call (median of {args.calls})")
    print("| forward | host (graph) | device |")
    print("|---|---|---|")
    for name, f in (("op by op", forward), ("mx.compile", compiled)) * 2:
        host, device = timed(f, tokens, kv, args.calls)
        print(f"| {name} | {1e3 * host:.3f} | {1e3 * device:.2f} |")
    if args.retrace:
        retraces(forward, compiled, kv, args.rows, args.calls)


def retraces(forward, compiled, kv, rows: int, calls: int) -> None:
    """What a compiled step pays when the batch's row count changes (a row joins or leaves,
    nearly every step at 32 chat users): each new shape is a new trace, made on its first call.
    And what padding the rows to a bucket instead would cost the device: the op-by-op
    forward's device time at fewer rows."""
    import mlx.core as mx

    print(f"\nrow counts below {rows}: the compiled forward's first call (a new trace) and later ones")
    print("| rows | first call host ms | later calls host ms | op by op device ms |")
    print("|---|---|---|---|")
    for b in range(rows - 1, rows - 5, -1):
        part = [a[:b] for a in kv]
        mx.eval(part)
        tokens = mx.zeros((b, 1), mx.uint32)
        t0 = time.perf_counter()
        out = compiled(tokens, *part)
        first = time.perf_counter() - t0
        mx.eval(out)
        later, _ = timed(compiled, tokens, part, calls)
        _, device = timed(forward, tokens, part, calls)
        print(f"| {b} | {1e3 * first:.2f} | {1e3 * later:.3f} | {1e3 * device:.2f} |")


if __name__ == "__main__":
    main()
