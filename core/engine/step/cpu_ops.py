"""Attention, SwiGLU and RoPE in forms that MLX's CPU backend runs faster, for the model's own layers.

On a Linux CPU (mlx[cpu] 0.32) two things bound a batched decode step of a small model more
than its matmuls do (measured on SmolLM2-135M, 32 rows of ~400 tokens, 2 cores):

- `mx.fast.scaled_dot_product_attention` has no CPU kernel; its fallback broadcasts each K/V
  head over the query heads that share it (grouped-query attention), ~8 ms a layer. Folding the
  query heads of a group into the query axis, (B, kv_heads, repeats * L, D) against
  (B, kv_heads, D, T), is one batched matmul with no broadcast: ~6 ms, the same numbers.
- `mx.exp` (and so softmax, sigmoid, SiLU) runs ~10x slower than numpy's exp here, while
  `mx.power(2, x)` runs ~2.4x faster than `mx.exp` at the same accuracy (the same relative error
  against float64 on normal inputs). So the softmax works in base 2 (the scale carries log2(e),
  as flash attention does) and SiLU's sigmoid is 1 / (1 + 2^(-x log2 e)).

A third costs the engine thread as well as the device: `mx.fast.rope` has no CPU kernel either,
and its fallback builds ~28 ops (the angles through `exp`, their cos and sin, the rotation) for
every call, two a layer, ~11 us of the engine thread each. In a decode step every layer's rows
sit at the same positions (the library builds one mask for all layers on the same premise), so
within `shared_positions` (core.engine.step.decode_batch's step) the step's cos and sin are computed
once, by the library's own rope of a unit vector, and each layer rotates with them in three ops:
`x * [cos, cos] + roll(x) * [-sin, sin]`, the fallback's products and sums bit for bit
(tests/test_cpu_ops.py; loadtests/bench_forward: ~23% fewer ops in a step's graph).

Together a 32-row decode step of SmolLM2 takes ~15-20% less time (loadtests/bench_step's
`--compare-cpu-ops` prints the ratio); greedy tokens stay those of the library's path, the logits
within float32 rounding (tests/test_cpu_ops.py). `install` rebinds the two names in the model's
own module (mlx-lm models import `scaled_dot_product_attention` and `swiglu` by name) to
wrappers that take the fast form only in a thread that asked for it (`use_here`: the engine
thread of an engine with `--cpu-ops`, so engines in one process each keep their setting),
when MLX runs on the CPU, in float32, and for a call they cover (no attention sinks, no
quantized cache); anything else goes to the library's function. It also turns the model's
plain `nn.RoPE` layers into `SharedRoPE`, a subclass that takes the step's table under the same
conditions (non-traditional, all of the head rotated) and is the library's RoPE otherwise. On a
Mac, MLX runs on the GPU, where the library's Metal kernels are the fast path: nothing changes there.

Runs in the engine thread (model loading and every forward).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn

LOG2E = 1.4426950408889634  # math.log2(math.e)
_NAMES = ("scaled_dot_product_attention", "swiglu")
_here = threading.local()


def use_here(on: bool) -> None:
    """Take the fast forms in this thread (where the model's module has them installed)."""
    _here.on = on


def _wanted() -> bool:
    return getattr(_here, "on", False) and mx.default_device() == mx.cpu


def _pow2(x: mx.array) -> mx.array:
    return mx.power(mx.array(2.0, x.dtype), x)


def softmax2(s: mx.array) -> mx.array:
    """softmax over the last axis of scores already in base 2 (scaled by log2(e))."""
    p = _pow2(s - s.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True)


def attention(
    queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask: str | mx.array | None
) -> mx.array:
    """softmax(q k^T * scale + mask) v for queries (B, H, L, D) and keys/values (B, Hkv, T, D).

    `mask` as mlx-lm passes it: None, "causal" (the last L of T positions), a boolean array
    (True = attend) or an additive one, broadcastable to (B, H, L, T)."""
    B, H, L, D = queries.shape
    kv_heads, T = keys.shape[1], keys.shape[2]
    r = H // kv_heads
    q = (queries * (scale * LOG2E)).reshape(B, kv_heads, r * L, D)
    s = masked((q @ keys.swapaxes(-1, -2)).reshape(B, kv_heads, r, L, T), mask, LOG2E)
    p = softmax2(s)
    out = p.reshape(B, kv_heads, r * L, T) @ values
    return out.reshape(B, H, L, D)


def masked(s: mx.array, mask: str | mx.array | None, additive: float = 1.0) -> mx.array:
    """Scores `s` grouped as (B, kv_heads, r, L, T) (the query heads of a K/V head together)
    with `mask` as mlx-lm passes it applied: None, "causal" (the last L of T positions), a
    boolean array (True = attend) or an additive one (times `additive`: the scores' base),
    broadcastable to (B, H, L, T)."""
    kv_heads, r, L, T = s.shape[1:]
    H = kv_heads * r
    # a masked score is the dtype's lowest, not -inf, as the library's: a row masked whole
    # then attends evenly instead of turning into NaN
    lowest = mx.array(mx.finfo(s.dtype).min, s.dtype)
    if isinstance(mask, str):
        if L > 1:  # "causal": query i sits at position T - L + i
            allowed = mx.arange(T - L, T)[:, None] >= mx.arange(T)[None]
            s = mx.where(allowed, s, lowest)
    elif mask is not None:
        m = mask
        if m.ndim == 4:  # (B|1, H|1, L|1, T) -> grouped (B|1, kv_heads|1, r|1, L|1, T)
            m = m.reshape(m.shape[0], kv_heads, r, *m.shape[2:]) if m.shape[1] == H and H > 1 else mx.expand_dims(m, 2)
        if m.dtype == mx.bool_:
            s = mx.where(m, s, lowest)
        else:
            s = s + m * additive
    return s


def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """silu(gate) * x with the sigmoid in base 2 (see the module's docstring)."""
    return gate * x / (1 + _pow2(gate * -LOG2E))


def _fast_sdpa(library: Callable[..., mx.array]) -> Callable[..., mx.array]:
    def scaled_dot_product_attention(
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        cache: Any,
        scale: float,
        mask: str | mx.array | None,
        sinks: mx.array | None = None,
    ) -> mx.array:
        if (
            sinks is not None
            or hasattr(cache, "bits")
            or not _wanted()
            or queries.dtype != mx.float32
            or keys.shape[1] == 0
            or queries.shape[1] % keys.shape[1]
        ):
            return library(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)
        return attention(queries, keys, values, scale, mask)

    scaled_dot_product_attention.library = library  # type: ignore[attr-defined]  # (how `install` knows a wrapper)
    return scaled_dot_product_attention


def _fast_swiglu(library: Callable[[mx.array, mx.array], mx.array]) -> Callable[[mx.array, mx.array], mx.array]:
    def fast(gate: mx.array, x: mx.array) -> mx.array:
        if not _wanted() or gate.dtype != mx.float32:
            return library(gate, x)
        return swiglu(gate, x)

    fast.library = library  # type: ignore[attr-defined]  # (as above)
    return fast


class _Positions:
    """One step's positions: the offset arrays its layers' caches hold, and the rotation
    tables made for them so far (by the RoPE's settings and the step's length)."""

    __slots__ = ("ids", "offsets", "tables")
    tables: dict[tuple[int, float, float, int], tuple[mx.array, mx.array]]

    def __init__(self, offsets: list[mx.array]):
        self.offsets = offsets  # held, so no other array takes one of their ids meanwhile
        self.ids, self.tables = {id(o) for o in offsets}, {}

    def table(self, rope: nn.RoPE, length: int) -> tuple[mx.array, mx.array]:
        key = (rope.dims, rope.base, rope.scale, length)
        if key not in self.tables:
            # the library's rope of (1, 0) halves is (cos, sin): its angles, exactly
            half, offset = rope.dims // 2, self.offsets[0]
            b = offset.shape[0] if offset.ndim else 1
            unit = mx.concatenate([mx.ones((b, 1, length, half)), mx.zeros((b, 1, length, half))], axis=-1)
            r = mx.fast.rope(unit, rope.dims, traditional=False, base=rope.base, scale=rope.scale, offset=offset)
            cos, sin = r[..., :half], r[..., half:]
            self.tables[key] = (mx.concatenate([cos, cos], axis=-1), mx.concatenate([-sin, sin], axis=-1))
        return self.tables[key]


@contextmanager
def shared_positions(caches: list[Any]) -> Iterator[None]:
    """Within: the RoPE of every layer whose cache is one of these takes one table of cos and
    sin. The caller vouches that the caches' offsets are equal (a decoding batch's layers);
    only caches of the first one's class take part (a sliding-window layer's cache keeps its
    positions its own way: its layers keep the library's RoPE)."""
    kind = type(caches[0]) if caches else None
    offsets = [c.offset for c in caches if type(c) is kind and isinstance(getattr(c, "offset", None), mx.array)]
    if not offsets or not _wanted():
        yield
        return
    _here.positions = _Positions(offsets)
    try:
        yield
    finally:
        _here.positions = None


class SharedRoPE(nn.RoPE):
    """`nn.RoPE` that rotates with the step's table (`shared_positions`) when it can."""

    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        p: _Positions | None = getattr(_here, "positions", None)
        if (
            p is None
            or id(offset) not in p.ids
            or self.traditional
            or x.dtype != mx.float32
            or x.shape[-1] != self.dims
        ):
            # (MLX annotates the offset an int, though it takes the cache's array too, and not the return)
            return super().__call__(x, offset)  # type: ignore[arg-type, no-any-return]
        cos, sin = p.table(self, x.shape[2])
        # [x1, x2] * [cos, cos] + [x2, x1] * [-sin, sin]: the fallback's x1 cos - x2 sin and
        # x2 cos + x1 sin, each the same two products and one sum
        return x * cos + mx.roll(x, self.dims // 2, axis=-1) * sin  # type: ignore[call-arg]  # (MLX's stub: positional)


def modules_of(model: nn.Module) -> set[str]:
    """The modules whose classes make up this model (a model may nest another's layers)."""
    # (MLX leaves named_modules unannotated)
    return {type(m).__module__ for _, m in model.named_modules()} | {type(model).__module__}  # type: ignore[no-untyped-call]


def install(model: nn.Module) -> list[str]:
    """Rebind attention and SwiGLU in the modules this model's layers come from (returns those
    modules) and make its plain RoPE layers `SharedRoPE`. Idempotent; a model whose modules
    use neither name is left as it is."""
    done = []
    for name in sorted(modules_of(model)):
        module = sys.modules.get(name)
        if module is None or not name.startswith("mlx_lm.models."):
            continue
        for attr, wrap in zip(_NAMES, (_fast_sdpa, _fast_swiglu)):
            fn = getattr(module, attr, None)
            if callable(fn) and not hasattr(fn, "library"):
                setattr(module, attr, wrap(fn))
        if any(hasattr(getattr(module, attr, None), "library") for attr in _NAMES):
            done.append(name)
    for _, m in model.named_modules():  # type: ignore[no-untyped-call]  # (as in modules_of)
        if type(m) is nn.RoPE:
            m.__class__ = SharedRoPE
    return done


def uninstall(model: nn.Module) -> None:
    """Put the library's functions and RoPE back."""
    for name in modules_of(model):
        module = sys.modules.get(name)
        for attr in _NAMES:
            fn: Any = getattr(module, attr, None) if module else None
            if hasattr(fn, "library"):
                setattr(module, attr, fn.library)
    for _, m in model.named_modules():  # type: ignore[no-untyped-call]  # (as in modules_of)
        if type(m) is SharedRoPE:
            m.__class__ = nn.RoPE  # type: ignore[assignment]  # (back to the library's class: the point)
