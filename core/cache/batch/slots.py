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
  and only when there are none is the buffer re-laid. A re-lay leaves a growth's worth of
  dead columns before the window as well as after it: with none there, the next row a
  little longer re-laid every row again (at 32 chat users a re-lay every few steps; 3-10%
  more output with the room, loadtests/bench_host);
- a leaving row is replaced by the last row (the generator is told to order its own lists
  the same way: `swap_order`), and the window's common left padding is dropped by moving
  `t0`, never by copying;
- buffers grow by half again in rows (up to the batch's row limit: more would be freed
  unused), and in columns by a quarter of the window (a
  `GRAIN` at least, the library's `step` of 256 at most: core.cache.batch.layout.growth), copying
  once, so a batch of short rows does not carry 256 spare columns each. Each layer re-lays a
  few columns early, by its place in the model (`stagger`), so a batch outgrowing its buffers
  re-lays one layer a step rather than every layer in one long step. The buffers give the room
  back when rows leave: a re-lay when half the rows are empty or the dead columns before the
  window outgrow it (`_spare_room`).

What the buffers hold follows the live rows, not the batch's history: under twice the rows
and 2.25 times the columns the live rows take, each padded to the longest (core.cache.batch.layout,
whose arithmetic the engine admits and preempts by, so a row pays for the padding it is
given, not only for its own tokens).

What a row's padding covers can be another request's stale K/V or zeros; the mask hides it
(the same boolean mask as the library's), and `extend` writes zeros there for a new row.

Speculative decoding (core.engine.step.speculate) writes a row's draft tokens beside the batch's
and keeps only the ones the model agreed with, a different number per row. `reject` makes
the rest *holes*: columns the mask hides for that row alone, while the row's `offset` (the
RoPE position of its next token) counts only what it kept. Holes cost columns, never
correctness: `extract` gathers a row's live columns only, and `compact` (run when holes
pile up, and before a trim) re-lays every row right-aligned without them.
Only plain `BatchKVCache` layers of the decoding batch are adopted (`adopt`); prompt
batches, rotating and hybrid caches stay the library's. The buffers are *planes*: one array
each for K and V, or, when the batch holds --kv-bits codes (`codes`, core.cache.batch.coded),
the codes, scales and biases MLX's quantized matmul reads, which every copy here moves
together (they share the row, head and time axes). `offset` is always rebound, never
changed in place (shared/seeds/004). Runs in the engine thread only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import BatchKVCache, KVCache

from radixchat.core.cache.batch.layout import GRAIN, growth
from radixchat.core.cache.kv_format import KVFormat
from radixchat.core.cache.rounded import format_of

Planes = tuple[mx.array, ...]  # a buffer, or a view of one: K (or V) as one array, or as codes


def _put(buf: Planes, index, src: Planes) -> None:
    for b, x in zip(buf, src):
        b[index] = x


def _at(buf: Planes, index) -> Planes:
    return tuple(b[index] for b in buf)


def _zeros(like: Planes, rows: int, width: int) -> Planes:
    """Buffers of `rows` rows and `width` columns for planes shaped as `like`'s."""
    return tuple(mx.zeros((rows, p.shape[1], width, p.shape[3]), p.dtype) for p in like)


def swap_order(keep: list[int]) -> list[int]:
    """A survivor order that moves fewest rows: each hole below the new size takes a
    survivor from above it; everyone else stays where they are."""
    m = len(keep)
    kept = set(keep)
    movers = iter(i for i in keep if i >= m)
    return [i if i in kept else next(movers) for i in range(m)]


def _pads_of(cache) -> list[int]:
    """A cache's left padding as a list (a slot cache keeps one; a library cache's array is
    read, once, as it joins)."""
    return list(cache._pads) if isinstance(cache, SlotKVCache) else cache.left_padding.tolist()


@contextmanager
def one_eval(caches: list) -> Iterator[None]:
    """The row writes of every layer's `filter` or `extend` inside the block wait for one
    evaluation of their sources, not one a layer: each evaluation waits for the step in
    flight and then for its own copies (on a GPU a sync and a launch; at 30 layers a row that
    left cost 30 of them). The writes are made as the block ends, before anything reads the
    buffers; a re-lay inside the block is made at once, its old buffers freed layer by layer."""
    slots = [c for c in caches if isinstance(c, SlotKVCache)]
    for c in slots:
        c._pending = []
    try:
        yield
    finally:
        mx.eval([(k, v) for c in slots for _, k, v in c._pending])
        for c in slots:
            c._flush()


class SlotKVCache(BatchKVCache):
    _pending: list | None = None  # row writes deferred to the end of a `one_eval` block
    _room_due = False  # `_spare_room` waits for those writes
    fmt: KVFormat | None = None  # --kv-bits: K and V written as their round trip (core.cache.rounded)
    codes = False  # the buffers hold `fmt`'s codes, not its round trip (core.cache.batch.coded)
    dtype: mx.Dtype | None = None  # the K/V's (what codes read back as)
    _k: Planes | None
    _v: Planes | None

    def __init__(self, left_padding: list[int], most_rows: int = 0):
        super().__init__(left_padding)
        self._k = self._v = None  # buffers; keys/values are the live views (as the model takes them)
        self._kw: Planes = ()
        self._vw: Planes = ()  # the live views as planes
        self._rows = len(left_padding)
        self.most_rows = most_rows  # the batch's row limit (0: none known): no room beyond it
        self.t0 = self._end = 0
        self._holes: dict[int, list[int]] = {}  # row -> buffer columns it rejected (see `reject`)

    # Each row's left padding, as a list: what the host decides by (which columns to drop,
    # where a row's tokens start) never waits on the device, as reading the array would,
    # behind the step in flight. The array, for the mask, is made from it when asked for.
    @property
    def left_padding(self) -> mx.array:
        if self._lp is None:
            self._lp = mx.array(self._pads)
        return self._lp

    @left_padding.setter
    def left_padding(self, v) -> None:
        if isinstance(v, mx.array):
            self._pads, self._lp = v.tolist(), v
        else:
            self._pads, self._lp = list(v), None

    stagger = 0  # columns early this layer re-lays when the window outgrows its buffers

    @classmethod
    def adopt(cls, c: BatchKVCache, most_rows: int = 0, stagger: int = 0) -> SlotKVCache:
        """The same rows, K/V and padding as a library cache (or another slot cache), in a
        buffer with spare room (rows up to `most_rows`, the batch's limit, when it is known).
        `stagger`: the layer's place in the model (see `update_and_fetch`)."""
        s = cls.__new__(cls)
        s.most_rows, s.stagger = most_rows, stagger
        s.fmt = format_of(c)
        s._rows = int(c.offset.shape[0])
        s.offset, s.left_padding, s._idx = c.offset, c.left_padding, c._idx
        s._right_padding = None
        s.t0 = s._end = 0
        s._k = s._v = None
        s._kw = s._vw = ()
        s.keys = s.values = None
        s._holes = {}
        if c.keys is not None:
            room = growth(c._idx)
            s._relay(rows=s._rows, left=room, extra=room, src=s._planes_of(c))
        return s

    @classmethod
    def merge(cls, caches):
        return cls.adopt(caches[0].merge(caches))  # (a prompt's cache merges as its class does: rounded or not)

    # -- what the buffers hold --------------------------------------------------------

    def _held(self, x: mx.array) -> Planes:
        """K or V as the buffers hold it (already at the cache's precision, when it has one)."""
        if self.dtype is None:
            self.dtype = x.dtype
        return (x,)

    def _read(self, p: Planes) -> mx.array:
        """What planes hold, as K or V in the model's dtype."""
        return p[0]

    def _face(self, p: Planes):
        """Planes as the model's attention takes them."""
        return p[0]

    def _planes_of(self, c) -> tuple[Planes, Planes]:
        """The first `_idx` columns of another cache's K and V, as these buffers hold them."""
        if isinstance(c, SlotKVCache):
            if type(c) is type(self) and c.fmt == self.fmt:
                return c._kw, c._vw
            k, v = c._read(c._kw), c._read(c._vw)
        else:
            k, v = c.keys[..., : c._idx, :], c.values[..., : c._idx, :]
        return self._held(k), self._held(v)

    # -- layout ---------------------------------------------------------------------

    def _views(self) -> None:
        window = (slice(0, self._rows), slice(None), slice(self.t0, self._end))
        self._kw, self._vw = _at(self._k, window), _at(self._v, window)
        self.keys, self.values = self._face(self._kw), self._face(self._vw)

    def _drop_views(self) -> None:
        self.keys = self.values = None
        self._kw = self._vw = ()

    def _write(self, index, k: Planes, v: Planes) -> None:
        """Write into the buffers in place. MLX reuses a buffer only when nothing unevaluated
        still reads it: a pending view of it (or a source read from it) makes the write copy
        the whole buffer, so the views are dropped first and the sources are evaluated (in
        a `one_eval` block, once for every layer, as the block ends)."""
        if self._pending is not None:
            self._pending.append((index, k, v))
            return
        self._drop_views()
        mx.eval(k, v)
        _put(self._k, index, k)
        _put(self._v, index, v)

    def _flush(self) -> None:
        """The end of a `one_eval` block: its writes (sources evaluated), then the room check."""
        pending, self._pending = self._pending or [], None
        if pending:
            self._drop_views()
            for index, k, v in pending:
                _put(self._k, index, k)
                _put(self._v, index, v)
            self._views()
        if self._room_due:
            self._room_due = False
            self._spare_room()

    def _relay(self, rows: int, left: int, extra: int, src: tuple[Planes, Planes] | None = None) -> None:
        """New buffers with room for `rows` rows, `left` dead columns before the window and
        `extra` after it, rounded up to `GRAIN`; the live window is copied across."""
        assert not self._pending, "a re-lay would copy rows whose writes are still pending"
        k, v = src if src is not None else (self._kw, self._vw)
        b = k[0].shape[0]
        cap_rows = self._k[0].shape[0] if src is None else b
        if rows > cap_rows:  # half again: a batch filling up re-lays its rows a few times only,
            cap_rows = max(rows, cap_rows * 3 // 2, 2)
            if self.most_rows:  # and never past the batch's limit
                cap_rows = max(rows, min(cap_rows, self.most_rows))
        elif 2 * rows <= cap_rows:  # half empty after a burst: give the memory back
            cap_rows = max(rows * 3 // 2, 2)
        width = -(-(left + self._idx + extra) // GRAIN) * GRAIN
        self._drop_views()  # (k and v still hold the old window)
        self._k, self._v = _zeros(k, cap_rows, width), _zeros(v, cap_rows, width)
        shift = left - self.t0  # the window moves to column `left`, its holes with it
        self._holes = {r: [c + shift for c in cols] for r, cols in self._holes.items()}
        if self._idx:
            # The sources read the old buffers, never these: the new ones are written in place
            # with no evaluation of the sources first (one wait for the step in flight, not two),
            # and evaluated now, so this layer's old buffers go before the next layer's are
            # re-laid: left to the step's eval, every layer's old and new buffers were alive at once
            window = (slice(0, b), slice(None), slice(left, left + self._idx))
            _put(self._k, window, k)
            _put(self._v, window, v)
            del k, v
            mx.eval(self._k, self._v)
        self.t0, self._end = left, left + self._idx
        self._views()

    # -- the library's contract -----------------------------------------------------

    def update_and_fetch(self, keys, values):
        if self.fmt is not None and not self.codes:
            keys, values = self.fmt.round_trip(keys), self.fmt.round_trip(values)
        n = keys.shape[2]
        k, v = self._held(keys), self._held(values)
        if self._k is None:
            self._rows = keys.shape[0]
            self._k, self._v = _zeros(k, self._rows, 0), _zeros(v, self._rows, 0)
            self._views()
        # A re-lay copies every row's K/V of its layer: at 32 rows of ~1,500 tokens 0.2 s a layer
        # on the bundled model here, all of a model's layers in one step. Each layer re-lays its
        # `stagger` columns early (its place in the model, at most half a growth), so a batch
        # that outgrows its buffers re-lays one layer a step, not all of them in one long step.
        # The new layout is the one this layer would take `early` steps from now, so the layers
        # keep their places: each still re-lays its stagger's columns before the next one.
        early = min(self.stagger, growth(self._idx + n) // 2)
        if self._end + n + early > self._k[0].shape[2]:
            room = growth(self._idx + n + early)
            self._relay(rows=self._rows, left=room, extra=n + room + early)
        self._drop_views()  # see _write; keys and values are the model's, not views of ours
        at = (slice(0, self._rows), slice(None), slice(self._end, self._end + n))
        _put(self._k, at, k)
        _put(self._v, at, v)
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
        self.compact()  # a trimmed hole must not count as a token
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
        self.offset = self.offset[mx.array(keep)]
        self.left_padding = [self._pads[i] for i in keep]
        if self._k is not None:
            moves = [(dst, src) for dst, src in enumerate(keep) if dst != src]
            # a row at a time: slice writes reuse the buffer, an indexed scatter copied it
            sources = [
                (
                    tuple(mx.contiguous(p[s : s + 1]) for p in self._k),
                    tuple(mx.contiguous(p[s : s + 1]) for p in self._v),
                )
                for _, s in moves
            ]
            for (dst, _), (k, v) in zip(moves, sources):
                self._write(slice(dst, dst + 1), k, v)
        self._rows = len(keep)
        self._holes = {dst: self._holes[src] for dst, src in enumerate(keep) if src in self._holes}
        if keep:
            drop = min(self._pads)
            if drop > 0:  # every row is padded there: the window starts later
                self.t0 += drop
                self._idx -= drop
                self.left_padding = [p - drop for p in self._pads]
        if self._k is not None:
            self._views()
            if self._pending is not None:  # the moves are not written yet
                self._room_due = True
            else:
                self._spare_room()

    def _spare_room(self) -> None:
        """Give memory back once the rows that left make the buffers mostly spare: a re-lay
        when half the rows or less are live, or when more dead columns lie before the window
        than it holds. Both need a third of the rows or half the window gone since the last
        re-lay, so the copies stay a constant share of the work, as the growth's do."""
        if not self._rows:
            return
        cap = self._k[0].shape[0]
        if (cap > 2 and 2 * self._rows <= cap) or self.t0 > self._idx + GRAIN:
            self._relay(rows=self._rows, left=growth(self._idx), extra=growth(self._idx))

    def extend(self, other):
        """Append `other`'s rows (a library cache or another slot cache), right-aligned at
        the write position."""
        b = int(other.offset.shape[0])
        if other.keys is None:
            if self._k is not None and b:
                raise ValueError("cannot join rows without K/V to a batch that has them")
            self.offset = mx.concatenate([self.offset, other.offset])
            self.left_padding = self._pads + _pads_of(other)
            self._rows += b
            return
        if self._k is None:
            if self._rows:
                raise ValueError("cannot join rows with K/V to a batch whose rows have none")
            self.__dict__.update(self.adopt(other, self.most_rows).__dict__)
            return
        ok, ov = self._planes_of(other)
        grow = max(0, other._idx - self._idx)
        if grow:
            if self.t0 < grow or self._rows + b > self._k[0].shape[0]:
                room = growth(self._idx + grow)
                self._relay(rows=self._rows + b, left=grow + room, extra=room)
            self.t0 -= grow
            self._idx += grow
            self.left_padding = [p + grow for p in self._pads]
        elif self._rows + b > self._k[0].shape[0]:
            self._relay(rows=self._rows + b, left=self.t0, extra=self._k[0].shape[2] - self._end)
        pad = self._idx - other._idx
        if pad:
            ok = tuple(mx.pad(p, [(0, 0), (0, 0), (pad, 0), (0, 0)]) for p in ok)
            ov = tuple(mx.pad(p, [(0, 0), (0, 0), (pad, 0), (0, 0)]) for p in ov)
        self._write((slice(self._rows, self._rows + b), slice(None), slice(self.t0, self._end)), ok, ov)
        self.offset = mx.concatenate([self.offset, other.offset])
        self.left_padding = self._pads + [p + pad for p in _pads_of(other)]
        self._rows += b
        self._views()

    def extract(self, idx):
        """Row `idx`'s tokens as a plain cache: its live columns, without padding or holes.

        Views, not copies (of a batch that holds codes, what they read back as): its one
        consumer, the prefix cache, copies the part it lacks (core.cache.kv's segments): a
        prompt's uncached tail at its end, a reply at its finish. A copy of the whole row
        first took four times as long. The engine drops the views within its step, before the
        next write into the buffers (which would copy them whole to keep the views valid)."""
        cache = KVCache()
        padding = self._pads[idx]
        row = (slice(idx, idx + 1), slice(None), slice(padding, None))
        keys, values = _at(self._kw, row), _at(self._vw, row)
        if self._holes.get(idx):
            cols = mx.array(self._live(idx, padding))
            keys = tuple(mx.take(p[idx : idx + 1], cols, axis=2) for p in self._kw)
            values = tuple(mx.take(p[idx : idx + 1], cols, axis=2) for p in self._vw)
        cache.keys, cache.values = self._read(keys), self._read(values)
        cache.offset = cache.keys.shape[2]
        return cache

    # -- holes (speculative decoding) ----------------------------------------------------

    def reject(self, counts: list[int]) -> None:
        """Row i keeps all but the last `counts[i]` columns written: those become holes, and
        its offset (the next token's position) goes back by as many."""
        if not any(counts):
            return
        for row, n in enumerate(counts):
            if n:
                self._holes.setdefault(row, []).extend(range(self._end - n, self._end))
        self.offset = self.offset - mx.array(counts, dtype=self.offset.dtype)

    @property
    def most_holes(self) -> int:
        return max((len(c) for c in self._holes.values()), default=0)

    def _live(self, row: int, padding: int) -> list[int]:
        """Window columns (from t0) of a row's tokens, in order."""
        dead = set(self._holes.get(row, ()))
        return [c - self.t0 for c in range(self.t0 + padding, self._end) if c not in dead]

    def make_mask(self, N: int, return_array: bool = False, **kwargs):
        mask = super().make_mask(N, return_array=return_array, **kwargs)
        if not self._holes:
            return mask
        live = np.ones((self._rows, self._idx + N), dtype=bool)
        for row, cols in self._holes.items():
            live[row, np.array(cols) - self.t0] = False
        return mask & mx.array(live)[:, None, None, :]

    def compact(self) -> None:
        """Re-lay every row right-aligned without its holes (one gather of the window)."""
        if not self._holes or self._k is None:
            self._holes = {}
            return
        pads = self._pads
        live = [self._live(r, pads[r]) for r in range(self._rows)]
        width = max(len(cols) for cols in live)
        index = mx.array([[0] * (width - len(cols)) + cols for cols in live])  # padding reads column 0

        def gather(p: mx.array) -> mx.array:
            b, h = p.shape[:2]
            return mx.take_along_axis(p, mx.broadcast_to(index[:, None, :, None], (b, h, width, p.shape[3])), axis=2)

        k, v = tuple(gather(p) for p in self._kw), tuple(gather(p) for p in self._vw)
        self._write((slice(0, self._rows), slice(None), slice(0, width)), k, v)
        self.t0, self._end, self._idx = 0, width, width
        self.left_padding = [width - len(cols) for cols in live]
        self._holes = {}
        self._views()

    def size(self):
        return self._idx

    def empty(self):
        return self._k is None

    @property
    def nbytes(self):
        return 0 if self._k is None else sum(p.nbytes for p in (*self._k, *self._v))
