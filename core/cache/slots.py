"""The decoding batch's K/V with room to spare, so a row that joins or leaves costs one row.

mlx-lm's `BatchKVCache` holds exactly the batch's rows: a prompt that joins the decoding
batch concatenates (copies) every row's K/V, and a request that leaves gathers (copies)
the survivors. On SmolLM2 at 32 rows of ~400 tokens that is ~0.11 s each way against a
0.4 s decode step, and at 32 chat users a row joins or leaves nearly every step.

`SlotKVCache` keeps the same contract (left-padded rows that share one write position,
`offset`/`left_padding` per row, the same mask) over buffers of shape
[row capacity, kv heads, time capacity, head dim]:

- the live rows are buffer rows `0..B-1`, and the live time window is `t0.._end`
  (`_idx = _end - t0` is the window's length, what the mask and the model see);
- a joining row is written into row `B`, right-aligned at the write position; if it is
  longer than the window, the window grows to the left over dead columns (`t0` moves),
  and only when there are none is the buffer re-laid;
- a leaving row is replaced by the last row (the generator is told to order its own lists
  the same way: `swap_order`), and the window's common left padding is dropped by moving
  `t0`, never by copying;
- buffers grow by half again in rows or by `step` columns, copying once, as the library
  grows, and give rows back when a re-lay finds them three-quarters empty.

What a row's padding covers can be another request's stale K/V or zeros; the mask hides it
(the same boolean mask as the library's), and `extend` writes zeros there for a new row.
Only plain `BatchKVCache` layers of the decoding batch are adopted (`adopt`); prompt
batches, rotating and hybrid caches stay the library's. `offset` is always rebound, never
changed in place (shared/seeds/004). Runs in the engine thread only.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache


def swap_order(keep: list[int]) -> list[int]:
    """A survivor order that moves fewest rows: each hole below the new size takes a
    survivor from above it; everyone else stays where they are."""
    m = len(keep)
    kept = set(keep)
    movers = iter(i for i in keep if i >= m)
    return [i if i in kept else next(movers) for i in range(m)]


class SlotKVCache(BatchKVCache):
    def __init__(self, left_padding: list[int]):
        super().__init__(left_padding)
        self._k = self._v = None  # buffers; keys/values are the live views
        self._rows = len(left_padding)
        self.t0 = self._end = 0

    @classmethod
    def adopt(cls, c: BatchKVCache) -> "SlotKVCache":
        """The same rows, K/V and padding as a library cache, in a buffer with spare room."""
        s = cls.__new__(cls)
        s._rows = int(c.offset.shape[0])
        s.offset, s.left_padding, s._idx = c.offset, c.left_padding, c._idx
        s._right_padding = None
        s.t0 = s._end = 0
        s._k = s._v = None
        s.keys = s.values = None
        if c.keys is not None:
            s._relay(rows=s._rows, left=0, extra=0, src=(c.keys[..., :c._idx, :], c.values[..., :c._idx, :]))
        return s

    @classmethod
    def merge(cls, caches):
        return cls.adopt(BatchKVCache.merge(caches))

    # -- layout ---------------------------------------------------------------------

    def _views(self) -> None:
        self.keys = self._k[: self._rows, :, self.t0: self._end, :]
        self.values = self._v[: self._rows, :, self.t0: self._end, :]

    def _write(self, index, k: mx.array, v: mx.array) -> None:
        """Write into the buffers in place. MLX reuses a buffer only when nothing unevaluated
        still reads it: a pending view of it (or a source read from it) makes the write copy
        the whole buffer, so the views are dropped first and the sources are evaluated."""
        self.keys = self.values = None
        mx.eval(k, v)
        self._k[index] = k
        self._v[index] = v

    def _relay(self, rows: int, left: int, extra: int, src=None) -> None:
        """New buffers with room for `rows` rows, `left` dead columns before the window and
        `extra` after it, rounded up to `step`; the live window is copied across."""
        k, v = src if src is not None else (self.keys, self.values)
        b, h, _, dk = k.shape
        dv = v.shape[3]
        cap_rows = self._k.shape[0] if src is None else b
        if rows > cap_rows:  # half again: a batch filling up re-lays its rows a few times only
            cap_rows = max(rows, cap_rows * 3 // 2, 4)
        elif 4 * rows <= cap_rows:  # mostly empty after a burst: give the memory back
            cap_rows = max(2 * rows, 4)
        width = -(-(left + self._idx + extra) // self.step) * self.step
        nk = mx.zeros((cap_rows, h, width, dk), k.dtype)
        nv = mx.zeros((cap_rows, h, width, dv), v.dtype)
        self._k, self._v = nk, nv
        if self._idx:
            self._write((slice(0, b), slice(None), slice(left, left + self._idx)), k, v)
        self.t0, self._end = left, left + self._idx
        self._views()

    # -- the library's contract -----------------------------------------------------

    def update_and_fetch(self, keys, values):
        n = keys.shape[2]
        if self._k is None:
            b, h, _, dk = keys.shape
            self._k = mx.zeros((b, h, 0, dk), keys.dtype)
            self._v = mx.zeros((b, h, 0, values.shape[3]), values.dtype)
            self._rows = b
            self._views()
        if self._end + n > self._k.shape[2]:
            self._relay(rows=self._rows, left=0, extra=n + self.step)
        self.keys = self.values = None  # see _write; keys and values are the model's, not views of ours
        self._k[: self._rows, :, self._end: self._end + n, :] = keys
        self._v[: self._rows, :, self._end: self._end + n, :] = values
        self._end += n
        self._idx += n
        self.offset = self.offset + n
        self._views()
        return self.keys, self.values

    def prepare(self, **kwargs):
        raise NotImplementedError("SlotKVCache holds decoding rows; prompts prefill in BatchKVCache")

    def finalize(self):
        raise NotImplementedError("SlotKVCache holds decoding rows; prompts prefill in BatchKVCache")

    @property
    def state(self):
        return self.keys, self.values, self.offset, self.left_padding, self._idx

    @state.setter
    def state(self, v):
        raise NotImplementedError("SlotKVCache cannot be restored from a state; adopt a BatchKVCache")

    def trim(self, n):
        n = min(self._idx, n)
        self._idx -= n
        self._end -= n
        self.offset = self.offset - n
        if self._k is not None:
            self._views()
        return n

    def filter(self, batch_indices):
        """Keep these rows, in this order; rows already in place are not touched."""
        keep = [int(i) for i in (batch_indices.tolist() if isinstance(batch_indices, mx.array) else batch_indices)]
        idx = mx.array(keep)
        self.offset = self.offset[idx]
        self.left_padding = self.left_padding[idx]
        if self._k is not None:
            moves = [(dst, src) for dst, src in enumerate(keep) if dst != src]
            # a row at a time: slice writes reuse the buffer, an indexed scatter copied it
            sources = [(mx.contiguous(self._k[s: s + 1]), mx.contiguous(self._v[s: s + 1])) for _, s in moves]
            for (dst, _), (k, v) in zip(moves, sources):
                self._write(slice(dst, dst + 1), k, v)
        self._rows = len(keep)
        if keep:
            drop = min(self.left_padding.tolist())
            if drop > 0:  # every row is padded there: the window starts later
                self.t0 += drop
                self._idx -= drop
                self.left_padding = self.left_padding - drop
        if self._k is not None:
            self._views()

    def extend(self, other):
        """Append `other`'s rows (a library cache or another slot cache), right-aligned at
        the write position."""
        b = int(other.offset.shape[0])
        if other.keys is None:
            if self._k is not None and b:
                raise ValueError("cannot join rows without K/V to a batch that has them")
            self.offset = mx.concatenate([self.offset, other.offset])
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self._rows += b
            return
        if self._k is None:
            if self._rows:
                raise ValueError("cannot join rows with K/V to a batch whose rows have none")
            self.__dict__.update(self.adopt(other).__dict__)
            return
        ok, ov = other.keys[..., : other._idx, :], other.values[..., : other._idx, :]
        grow = max(0, other._idx - self._idx)
        if grow:
            if self.t0 < grow or self._rows + b > self._k.shape[0]:
                self._relay(rows=self._rows + b, left=grow, extra=self.step)
            self.t0 -= grow
            self._idx += grow
            self.left_padding = self.left_padding + grow
        elif self._rows + b > self._k.shape[0]:
            self._relay(rows=self._rows + b, left=self.t0, extra=self._k.shape[2] - self._end)
        pad = self._idx - other._idx
        if pad:
            ok = mx.pad(ok, [(0, 0), (0, 0), (pad, 0), (0, 0)])
            ov = mx.pad(ov, [(0, 0), (0, 0), (pad, 0), (0, 0)])
        self._write((slice(self._rows, self._rows + b), slice(None), slice(self.t0, self._end)), ok, ov)
        self.offset = mx.concatenate([self.offset, other.offset])
        self.left_padding = mx.concatenate([self.left_padding, other.left_padding + pad])
        self._rows += b
        self._views()

    def extract(self, idx):
        cache = KVCache()
        padding = self.left_padding.tolist()[idx]
        cache.keys = mx.contiguous(self.keys[idx: idx + 1, :, padding:, :])
        cache.values = mx.contiguous(self.values[idx: idx + 1, :, padding:, :])
        cache.offset = cache.keys.shape[2]
        return cache

    def size(self):
        return self._idx

    def empty(self):
        return self._k is None

    @property
    def nbytes(self):
        return 0 if self._k is None else self._k.nbytes + self._v.nbytes
