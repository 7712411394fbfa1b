"""Decode attention over quantized K/V against the model's dtype, on this machine's device
(issue 54: what a decoding batch held at --kv-bits would cost a step).

A decoding batch that held its K/V as codes would attend with mlx-lm's
`quantized_scaled_dot_product_attention` (two `mx.quantized_matmul`s, affine codes) where
it now calls `mx.fast.scaled_dot_product_attention` over K/V at the model's dtype. This
times one layer's decode attention both ways: --rows queries of one token, --kv-heads heads
of --head-dim (SmolLM2's 9 query and 3 K/V heads of 64 by default) over --context positions,
for float32 and bfloat16, at 8 bits (groups of 32 and 64) and 4 (groups of 32). Printed: ms
a layer, the ratio against the unquantized call, and that call's ms for --layers layers.

    python -m loadtests.bench_kv_attention [--rows 1,32] [--context 256,1024,2048]
        [--heads 9] [--kv-heads 3] [--head-dim 64] [--layers 30] [--repeat 20]

In this process; OpenBLAS preloaded on Linux, as the server runs.
"""

from __future__ import annotations

import argparse
import time


def timed(fn, repeat: int) -> float:
    """Milliseconds a call, evaluated, after three warm-up calls."""
    import mlx.core as mx

    for _ in range(3):
        mx.eval(fn())
    start = time.perf_counter()
    for _ in range(repeat):
        mx.eval(fn())
    return (time.perf_counter() - start) / repeat * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="1,32", help="comma-separated batch sizes")
    p.add_argument("--context", default="256,1024,2048", help="comma-separated K/V lengths")
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=30, help="for the last column: the unquantized call times this")
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args()
    from radixchat.core.platform.blas import reexec_with_openblas

    reexec_with_openblas()
    import mlx.core as mx
    from mlx_lm.models.base import quantized_scaled_dot_product_attention

    formats = [(8, 32), (8, 64), (4, 32)]
    scale = args.head_dim**-0.5
    print(f"device {mx.default_device()}; {args.heads} query heads, {args.kv_heads} K/V heads of {args.head_dim}")
    print(
        "| dtype | rows | context | model dtype ms | "
        + " | ".join(f"{b} bits, groups of {g}: ms (x)" for b, g in formats)
        + f" | model dtype, {args.layers} layers ms |"
    )
    print("|---" * (5 + len(formats)) + "|")
    for dtype in (mx.float32, mx.bfloat16):
        for rows in [int(r) for r in args.rows.split(",")]:
            for context in [int(c) for c in args.context.split(",")]:
                q = mx.random.normal((rows, args.heads, 1, args.head_dim)).astype(dtype)
                k, v = (mx.random.normal((rows, args.kv_heads, context, args.head_dim)).astype(dtype) for _ in range(2))
                mx.eval(q, k, v)
                base = timed(
                    lambda q=q, k=k, v=v: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale), args.repeat
                )
                cells = []
                for bits, group in formats:
                    qk, qv = mx.quantize(k, group_size=group, bits=bits), mx.quantize(v, group_size=group, bits=bits)
                    mx.eval(qk, qv)
                    ms = timed(
                        lambda q=q, qk=qk, qv=qv, b=bits, g=group: quantized_scaled_dot_product_attention(
                            q, qk, qv, scale, None, group_size=g, bits=b
                        ),
                        args.repeat,
                    )
                    cells.append(f"{ms:.2f} ({ms / base:.2f}x)")
                name = str(dtype).removeprefix("mlx.core.")
                print(
                    f"| {name} | {rows} | {context} | {base:.2f} | "
                    + " | ".join(cells)
                    + f" | {base * args.layers:.0f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
