"""Whether the decoding batch holds --kv-bits codes (core.cache.batch.coded), and the model's
attention routed to them.

`--kv-batch codes` makes the decoding batch's slots hold the codes, `values` their round trip
at the model's dtype, `auto` (the default) codes where MLX runs on a GPU and values on a CPU.
Why: attention over codes is a quantized matmul, which on this project's CPU (MLX's CPU
backend, 2 cores) took 1.9x-6.3x the time of attention over float32 K/V
(loadtests/bench_kv_attention.py), while on a GPU MLX's quantized kernels read fewer bytes,
which is what a decode step's attention waits on. `holds_codes` also keeps values where codes
cannot be had: no --kv-bits, no slots (`--no-kv-slots`), a dtype whose scale the affine
planes would not hold exactly (float16), or a model whose attention does not go through
mlx-lm's `scaled_dot_product_attention` by name (`install` could not route it).

`choose` decides it for an engine at start: `holds_codes`, then `probe`, which tries the
device's quantized matmul on the format's codes (a backend that cannot read them keeps
values, and the log says why, rather than failing the first decode step).

`install` rebinds that name in the modules the model's layers come from to a wrapper that
sends a `CodedSlotKVCache` to `attend` (attention over its codes) and anything else to what was there (the
library's function, or core.engine.step.cpu_ops' wrapper of it). Runs in the engine thread
(model loading and every forward).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from radixchat.core.cache.batch.coded import CodedSlotKVCache
from radixchat.core.cache.batch.slots import Planes
from radixchat.core.cache.kv_format import KVFormat
from radixchat.core.config import KVBatch
from radixchat.core.engine.step.cpu_ops import masked, modules_of

log = logging.getLogger("radixchat.engine")
NAME = "scaled_dot_product_attention"


def _routed(inner: Callable[..., mx.array]) -> Callable[..., mx.array]:
    def scaled_dot_product_attention(
        queries: mx.array, keys: Any, values: Any, cache: Any, scale: float, mask: Any, sinks: Any = None
    ) -> mx.array:
        if isinstance(cache, CodedSlotKVCache) and sinks is None and cache.fmt is not None:
            return attend(queries, keys, values, cache.fmt, scale, mask)
        return inner(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)

    scaled_dot_product_attention.coded_inner = inner  # type: ignore[attr-defined]  # (how `install` knows its own)
    return scaled_dot_product_attention


def attend(queries: mx.array, keys: Planes, values: Planes, fmt: KVFormat, scale: float, mask: Any) -> mx.array:
    """softmax(q k^T * scale + mask) v over K and V held as `fmt`'s codes (planes), for
    queries (B, H, L, D): one quantized matmul for the scores and one for the values, the
    query heads of a group folded into the query axis (as cpu_ops.attention does)."""
    B, H, L, D = queries.shape
    kv_heads, T = keys[0].shape[1], keys[0].shape[2]
    r = H // kv_heads
    q = (queries * scale).reshape(B, kv_heads, r * L, D)
    s = masked(fmt.matmul(q, keys, transpose=True).reshape(B, kv_heads, r, L, T), mask)
    p = mx.softmax(s, axis=-1, precise=True).reshape(B, kv_heads, r * L, T)
    return fmt.matmul(p, values, transpose=False).reshape(B, H, L, D)


def install(model: nn.Module) -> bool:
    """Route the model's attention over coded caches to them; False where no module of its
    layers has an attention of that name to route (such a model's batch keeps values)."""
    found = False
    for name in sorted(modules_of(model)):
        module = sys.modules.get(name)
        if module is None or not name.startswith("mlx_lm.models."):
            continue
        fn = getattr(module, NAME, None)
        if callable(fn):
            found = True
            if not hasattr(fn, "coded_inner"):
                setattr(module, NAME, _routed(fn))
    return found


def choose(setting: KVBatch, fmt: KVFormat | None, dtype: mx.Dtype | None, slots: bool, model: nn.Module) -> bool:
    """Whether this engine's decoding batch holds codes: `holds_codes`, with the model's
    attention routed (`install`) and the device tried (`probe`); a batch asked for codes that
    holds values says why in the log."""
    routed = fmt is not None and slots and install(model)
    codes = holds_codes(setting, fmt, dtype, slots, routed)
    if setting == "codes" and fmt is not None and not codes:
        log.warning("--kv-batch codes: %s", why_values(dtype, slots))
    if codes and fmt is not None and dtype is not None and (why := probe(fmt, dtype)) is not None:
        log.warning("--kv-batch %s: %s", setting, why)
        return False
    return codes


def probe(fmt: KVFormat, dtype: mx.Dtype) -> str | None:
    """Why this device cannot attend over `fmt`'s codes in `dtype` (None: it can), tried on two
    rows of a few positions as a decode step would: a backend whose quantized matmul lacks the
    mode (or batched weights) says so here, at start, not in the first step."""
    try:
        x = mx.ones((2, 2, 4, 64), dtype)
        k = fmt.planes(x)
        s = fmt.matmul(x[:, :, :1], k, transpose=True)
        mx.eval(fmt.matmul(mx.softmax(s, axis=-1), k, transpose=False))
    except (RuntimeError, ValueError, TypeError) as e:
        return f"this device's quantized matmul cannot read {fmt.attend_mode} codes ({e}): the batch holds values"
    return None


def why_values(dtype: mx.Dtype | None, slots: bool) -> str:
    """Why a batch asked for codes at a --kv-bits precision holds values (for the log)."""
    if not slots:
        return "the batch is mlx-lm's BatchKVCache here (--no-kv-slots, --step-tokens 0 or mlx.launch): it holds values"
    if dtype not in (mx.float32, mx.bfloat16):
        return f"the model's K/V is {str(dtype).removeprefix('mlx.core.')}, whose scales the codes would not hold exactly: the batch holds values"
    return "this model's attention is not mlx-lm's scaled_dot_product_attention: the batch holds values"


def holds_codes(setting: KVBatch, fmt: KVFormat | None, dtype: mx.Dtype | None, slots: bool, routed: bool) -> bool:
    """Whether the decoding batch holds codes (see the module's docstring)."""
    if fmt is None or not slots or not routed or dtype not in (mx.float32, mx.bfloat16) or setting == "values":
        return False
    return setting == "codes" or mx.default_device() == mx.gpu
