"""The precision K/V is kept at (`--kv-bits`): what a quantized token is, in bytes and numbers.

At 8 bits K and V are stored as signed bytes with a bfloat16 scale per 32 numbers along the
head dimension (`Int8`; 64 or 128 with --kv-group-size); at 4 bits as MLX's nvfp4 format
(`mx.quantize`: a 4-bit float a number, an 8-bit float scale per 16). Every cache attends over their round trip
(`round_trip`: quantized, then dequantized). The decoding batch holds that round trip at the
model's dtype; the radix tree and the disk tier hold the codes (`encode`), and give back
exactly the numbers the batch held (`decode`), because these formats' round trip is
idempotent: the round trip of a round trip is itself. MLX's affine format (a scale and a
bias per group, mlx-lm's `QuantizedKVCache`) is not: cached from what a batch held, it would
read back different numbers, and a cached prefix would give another reply than the same
prefix computed afresh. tests/test_kv_format.py holds both facts;
loadtests/bench_kv_quality.py measures what each format costs a model's answers.

Which caches round-trip what they are given is core.cache.rounded's. Runs MLX: the engine
thread (and whoever measures).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, replace

import mlx.core as mx

from radixchat.core.config import kv_group_refusal

BITS = (16, 8, 4)  # what --kv-bits takes; 16: the model's own dtype, nothing quantized


@dataclass(frozen=True)
class KVFormat:
    """One of MLX's small float formats (`mx.quantize`'s modes mxfp8, mxfp4, nvfp4)."""

    mode: str  # MLX's quantization mode
    bits: int
    group: int  # numbers per scale, along the head dimension
    scale_bytes: int = 1

    @property
    def name(self) -> str:
        """What logs, the doctor and the disk tier's fingerprint call it: the mode, and the
        group where --kv-group-size made it other than the format's own."""
        own = type(self).__dataclass_fields__["group"].default
        return self.mode if self.group == own or own is MISSING else f"{self.mode}-g{self.group}"

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
        return head_dim * self.bits / 8 + head_dim // self.group * self.scale_bytes

    # The decoding batch's codes (core.cache.batch.coded): `x` in the form MLX's quantized
    # matmul reads in `attend_mode`, and back. For MLX's own formats that is `encode`'s.
    @property
    def attend_mode(self) -> str:
        return self.mode

    def planes(self, x: mx.array) -> tuple[mx.array, ...]:
        """`x` as the arrays `mx.quantized_matmul(..., mode=attend_mode)` takes after it (its
        codes, scales and, where the mode has them, biases), each keeping `x`'s leading axes."""
        return self.encode(x)

    def from_planes(self, planes: tuple[mx.array, ...], dtype: mx.Dtype) -> mx.array:
        """What `planes` hold, in `dtype`: exactly `round_trip` of what they were made from."""
        return self.decode(planes[0], planes[1], dtype)

    def matmul(self, x: mx.array, planes: tuple[mx.array, ...], transpose: bool) -> mx.array:
        """`x` times what `planes` hold (transposed: against each of their vectors, as scores
        are made from K), by MLX's quantized matmul, which reads the codes where they are."""
        biases = planes[2] if len(planes) > 2 else None
        return mx.quantized_matmul(
            x,
            planes[0],
            planes[1],
            biases,
            transpose=transpose,
            group_size=self.group,
            bits=self.bits,
            mode=self.attend_mode,
        )


@dataclass(frozen=True)
class Pow2Int8(KVFormat):
    """Signed 8-bit integers with one power-of-two scale per 32 numbers (its exponent, a
    byte): the scale is the least power of two that fits the group's largest magnitude in
    127 steps, so that magnitude takes 64 to 127 of them and the round trip of a round trip
    keeps the scale and every code. Not one of MLX's formats (no quantized matmul reads it);
    the round trip is plain MLX arithmetic. --kv-bits 8 until `Int8`: on SmolLM2 it kept
    98.8% of greedy tokens where mxfp8 (3 bits of mantissa) kept 97.2% (BENCHMARKS.md)."""

    mode: str = "int8-pow2"
    bits: int = 8
    group: int = 32

    def encode(self, x: mx.array) -> tuple[mx.array, mx.array]:
        # float16 holds q * 2**e exactly only from 2**-24 up (its subnormals) and to 2**15
        lo, hi = (-24, 8) if x.dtype == mx.float16 else (-126, 127)
        g = _groups(x, self.group).astype(mx.float32)
        most = mx.max(mx.abs(g), axis=-1, keepdims=True)
        e = mx.clip(mx.ceil(mx.log2(mx.maximum(most, 1e-38) / 127)), lo, hi)
        q = mx.clip(mx.round(g / mx.power(2.0, e)), -127, 127).astype(mx.int8)
        return q.reshape(x.shape), e.squeeze(-1).astype(mx.int8)

    def decode(self, codes: mx.array, scales: mx.array, dtype: mx.Dtype) -> mx.array:
        g = _groups(codes, self.group).astype(mx.float32) * mx.power(2.0, scales.astype(mx.float32))[..., None]
        return g.reshape(codes.shape).astype(dtype)


@dataclass(frozen=True)
class Int8(KVFormat):
    """Signed 8-bit integers with one bfloat16 scale per 32 numbers (a group; 64 or 128 where
    --kv-group-size says, the argument below the same for any): the scale is the group's
    largest magnitude over 127, rounded to bfloat16, and that magnitude is coded 127 whatever
    the rounding (so it moves by at most a quarter of a step; the others by half a step at
    most). Why the round trip of a round trip is itself: the round trip's largest magnitude is
    127 scales, as the dtype rounds it, and a bfloat16 scale (8 significant bits) comes back
    from that exactly: exactly in float32 (a code times the scale is exact there), and in
    float16 and bfloat16 for every largest magnitude the dtype holds (tests/test_kv_format.py
    tries each); a code times the scale, rounded, is within half a step of the code's own
    product, so every code comes back too. Two thirds of `Pow2Int8`'s error on normal numbers,
    and on SmolLM2 more of its greedy tokens (BENCHMARKS.md)."""

    mode: str = "int8"
    bits: int = 8
    group: int = 32
    scale_bytes: int = 2

    def encode(self, x: mx.array) -> tuple[mx.array, mx.array]:
        g = _groups(x, self.group).astype(mx.float32)
        # capped where 127 scales stay finite in the dtype (float16: 65,024), so no round trip overflows
        most = mx.minimum(mx.max(mx.abs(g), axis=-1, keepdims=True), _MOST.get(x.dtype, 3e38))
        scale = (most / 127).astype(mx.bfloat16)
        s = mx.where(scale > 0, scale.astype(mx.float32), 1.0)  # an all-zero group: codes 0
        q = mx.clip(mx.round(g / s), -127, 127)
        q = mx.where((mx.abs(g) >= most) & (scale > 0), mx.sign(g) * 127, q)
        return q.astype(mx.int8).reshape(x.shape), scale.squeeze(-1)

    def decode(self, codes: mx.array, scales: mx.array, dtype: mx.Dtype) -> mx.array:
        g = _groups(codes, self.group).astype(mx.float32) * scales.astype(mx.float32)[..., None]
        return g.reshape(codes.shape).astype(dtype)

    # No quantized matmul reads signed bytes, but MLX's affine 8 bits holds them exactly: an
    # unsigned code c + 128 with the scale s and the bias -128 s (a power of two times s: exact
    # in the scale's dtype) reads back s (c + 128) - 128 s = s c, the round trip, wherever the
    # product is formed in float32 (MLX's kernels accumulate there; its `dequantize` of
    # bfloat16 does not, hence `from_planes`' own arithmetic). The scale is kept in the K/V's
    # dtype, as the matmul wants it: exact for float32 and bfloat16 (a bfloat16 scale), which
    # are the dtypes the batch keeps codes for (core.cache.batch.coded.holds_codes).
    @property
    def attend_mode(self) -> str:
        return "affine"

    def planes(self, x: mx.array) -> tuple[mx.array, ...]:
        codes, scale = self.encode(x)
        unsigned = (codes.astype(mx.int16) + 128).astype(mx.uint8).view(mx.uint32)
        s = scale.astype(mx.float32)
        return unsigned, s.astype(x.dtype), (-128 * s).astype(x.dtype)

    def from_planes(self, planes: tuple[mx.array, ...], dtype: mx.Dtype) -> mx.array:
        codes = planes[0].view(mx.uint8).astype(mx.int16) - 128
        return self.decode(codes, planes[1], dtype)


_MOST = {mx.float16: 65000.0}


def _groups(x: mx.array, group: int) -> mx.array:
    return x.reshape(*x.shape[:-1], x.shape[-1] // group, group)


# --kv-bits 8 and 4. On SmolLM2, 4 bits as nvfp4 kept 89.5% of greedy tokens where mxfp4
# kept 81.1% (BENCHMARKS.md)
FORMATS: dict[int, KVFormat] = {8: Int8(), 4: KVFormat("nvfp4", 4, 16)}
# measured against (loadtests/bench_kv_quality.py), not offered
MXFP8, MXFP4, POW2_INT8 = KVFormat("mxfp8", 8, 32), KVFormat("mxfp4", 4, 32), Pow2Int8()


def kv_format(bits: int, group: int | None = None) -> KVFormat | None:
    """The format of --kv-bits `bits` (None: 16, the model's own dtype), with `group`
    numbers per scale (--kv-group-size; None: the format's own)."""
    if bits not in BITS:
        raise ValueError(f"kv_bits: one of {', '.join(map(str, BITS))} (got {bits})")
    fmt = FORMATS.get(bits)
    if group is None:
        return fmt
    if (why := kv_group_refusal(bits, group)) is not None:
        raise ValueError(why)
    return replace(fmt, group=group)
