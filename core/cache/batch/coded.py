"""The decoding batch holding --kv-bits codes: its slot buffers keep each token's K and V as
the codes and scales of the format (core.cache.kv_format), and attention reads them there.

With `--kv-bits 8` or `4` the radix tree and the disk tier hold codes, and so do the
prompts' caches' round trips; a `SlotKVCache` of the decoding batch holds that round trip at
the model's dtype (2 or 4 bytes a number). `CodedSlotKVCache` holds the codes instead
(`KVFormat.planes`: MLX's affine 8 bits for `Int8`, which holds its signed bytes exactly;
nvfp4 as it is), 0.56x or 0.28x of bfloat16 K/V (the 8-bit planes' bias is their extra over
the tree's 0.53x), so the running batch takes that much less of the K/V budget too. Its K and V, as the model's attention gets them, are tuples of
planes; `attend` is that attention (one quantized matmul for the scores and one for the
values, the query heads of a group folded into the query axis), which
core.engine.step.coded_attention routes the model's attention to for these caches.

Transparency holds as with the rounded batch: the planes read back (`KVFormat.from_planes`)
exactly the round trip a prompt's cache attends over, which `extract` gives the prefix tree,
whose codes of it are the batch's own (the formats' round trip is idempotent). Attention
over codes and over their round trip give the same scores up to float rounding (the codes
are dequantized inside the matmul, in float32), so a reply from a batch that holds codes can
differ from one from a batch that holds values, as any two kernels can; a cached prefix and
the same prefix computed afresh go through the same ones.

Which engines hold codes is core.engine.step.coded_attention's (`holds_codes`). Runs MLX: the
engine thread.
"""

from __future__ import annotations

import mlx.core as mx

from radixchat.core.cache.batch.slots import Planes, SlotKVCache


class CodedSlotKVCache(SlotKVCache):
    codes = True

    # mlx-lm's attention sends a cache with `bits` to its quantized path, which reads MLX's
    # affine format only; core.engine.step.coded_attention sends these caches to `attend`
    # first, so the attribute only keeps the library's other wrappers (core.engine.step.cpu_ops)
    # off them
    @property
    def bits(self) -> int:
        assert self.fmt is not None
        return self.fmt.bits

    @property
    def group_size(self) -> int:
        assert self.fmt is not None
        return self.fmt.group

    def _held(self, x: mx.array) -> Planes:
        assert self.fmt is not None, "a batch holds codes only at a --kv-bits precision"
        if self.dtype is None:
            self.dtype = x.dtype
        return self.fmt.planes(x)

    def _read(self, p: Planes) -> mx.array:
        assert self.fmt is not None and self.dtype is not None
        return self.fmt.from_planes(p, self.dtype)

    def _face(self, p: Planes):
        return p

    def attend(self, queries: mx.array, keys: Planes, values: Planes, scale: float, mask) -> mx.array:
        """softmax(q k^T * scale + mask) v over K and V held as codes, for queries (B, H, L, D)
        and a mask as mlx-lm passes it (None, "causal", boolean or additive, broadcastable
        to (B, H, L, T))."""
        fmt = self.fmt
        assert fmt is not None
        B, H, L, D = queries.shape
        kv_heads, T = keys[0].shape[1], keys[0].shape[2]
        r = H // kv_heads
        q = (queries * scale).reshape(B, kv_heads, r * L, D)
        s = fmt.matmul(q, keys, transpose=True).reshape(B, kv_heads, r, L, T)
        lowest = mx.array(mx.finfo(s.dtype).min, s.dtype)  # as the library's: never NaN
        if isinstance(mask, str):
            if L > 1:  # "causal": query i sits at position T - L + i
                s = mx.where(mx.arange(T - L, T)[:, None] >= mx.arange(T)[None], s, lowest)
        elif mask is not None:
            m = mask
            if m.ndim == 4:  # (B|1, H|1, L|1, T) -> grouped (B|1, kv_heads|1, r|1, L|1, T)
                m = (
                    m.reshape(m.shape[0], kv_heads, r, *m.shape[2:])
                    if m.shape[1] == H and H > 1
                    else mx.expand_dims(m, 2)
                )
            s = mx.where(m, s, lowest) if m.dtype == mx.bool_ else s + m
        p = mx.softmax(s, axis=-1, precise=True).reshape(B, kv_heads, r * L, T)
        out = fmt.matmul(p, values, transpose=False)
        return out.reshape(B, H, L, D)
