"""The decoding batch holding --kv-bits codes: its slot buffers keep each token's K and V as
the codes and scales of the format (core.cache.kv_format), and attention reads them there.

With `--kv-bits 8` or `4` the radix tree and the disk tier hold codes, and so do the
prompts' caches' round trips; a `SlotKVCache` of the decoding batch holds that round trip at
the model's dtype (2 or 4 bytes a number). `CodedSlotKVCache` holds the codes instead
(`KVFormat.planes`: MLX's affine 8 bits for `Int8`, which holds its signed bytes exactly;
nvfp4 as it is), 0.56x or 0.28x of bfloat16 K/V (the 8-bit planes' bias is their extra over
the tree's 0.53x), so the running batch takes that much less of the K/V budget too. Its K and V, as the model's attention gets them, are tuples of
planes, which core.engine.step.coded_attention's `attend` reads (the model's attention is
routed there for these caches).

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
    # affine format only; core.engine.step.coded_attention sends these caches to its `attend`
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
