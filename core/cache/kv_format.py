"""The precision K/V is kept at (`--kv-bits`): what a quantized token is, in bytes and numbers.

At 8 or 4 bits, K and V are stored as one of MLX's microscaling float formats (`mx.quantize`
with mode `mxfp8` or `mxfp4`: a code per number and one power-of-two scale per 32 along the
head dimension), and every cache attends over their round trip (`round_trip`: quantized,
then dequantized). The decoding batch holds that round trip at the model's dtype; the radix
tree and the disk tier hold the codes (`encode`), and give back exactly the numbers the
batch held (`decode`), because these formats' round trip is idempotent: the round trip of
a round trip is itself. MLX's affine format (a scale and a bias per group, mlx-lm's
`QuantizedKVCache`) is not: cached from what a batch held, it would read back different
numbers, and a cached prefix would give another reply than the same prefix computed afresh.
tests/test_kv_format.py holds both facts; loadtests/bench_kv_quality.py measures what each
format costs a model's answers.

Which caches round-trip what they are given is core.cache.rounded's. Runs MLX: the engine
thread (and whoever measures).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

BITS = (16, 8, 4)  # what --kv-bits takes; 16: the model's own dtype, nothing quantized


@dataclass(frozen=True)
class KVFormat:
    mode: str  # MLX's quantization mode
    bits: int
    group: int  # numbers per scale, along the head dimension

    def fits(self, head_dim: int) -> bool:
        return head_dim % self.group == 0

    def round_trip(self, x: mx.array) -> mx.array:
        """`x` as a cache at this precision gives it back, in `x`'s dtype."""
        return self.decode(*self.encode(x), x.dtype)

    def encode(self, x: mx.array) -> tuple[mx.array, mx.array]:
        """(codes, scales) of `x` (… , head dim): both keep `x`'s leading axes, so a run of
        tokens is a slice along the token axis of either."""
        codes, scales, *_ = mx.quantize(x, group_size=self.group, bits=self.bits, mode=self.mode)
        return codes, scales

    def decode(self, codes: mx.array, scales: mx.array, dtype: mx.Dtype) -> mx.array:
        out = mx.dequantize(codes, scales, group_size=self.group, bits=self.bits, mode=self.mode)
        return out.astype(dtype)

    def bytes_per(self, head_dim: int) -> float:
        """Bytes one head's vector of `head_dim` takes: its codes and its scales."""
        return head_dim * self.bits / 8 + head_dim // self.group


FORMATS = {8: KVFormat("mxfp8", 8, 32), 4: KVFormat("mxfp4", 4, 32)}


def kv_format(bits: int) -> KVFormat | None:
    """The format of --kv-bits `bits` (None: 16, the model's own dtype)."""
    if bits not in BITS:
        raise ValueError(f"kv_bits: one of {', '.join(map(str, BITS))} (got {bits})")
    return FORMATS.get(bits)
