"""MLX side of the prefix cache: K/V segments, snapshots, and the PrefixStore the engine uses.

A `KVSegment` holds, for each trimmable layer (mlx-lm `KVCache`), an own copy of the K/V
of a run of tokens: shape (1, heads, n, dim), exactly n long; at a --kv-bits precision, its
codes and scales (core.cache.kv_format), decoded on a restore into exactly what was stored. A `Snapshot` holds the
whole state of every other layer (SSM `ArraysCache`, `RotatingKVCache`, ...) at one
position; a sliding-window layer's, cut to its window. Copies are made with
`mx.contiguous`, because a plain slice keeps its source buffer alive (a stale tail the
tree must never hold; see shared/seeds/000).

`PrefixStore.lookup` restores per-layer caches whose arrays are exactly the matched
length (the physical trim by construction: nothing is ever trimmed by moving an offset).
`PrefixStore.store` inserts a finished or prefilled sequence. The tree logic is core.cache.radix;
with a disk tier (core.cache.disk.tier, `PrefixStore.disk`) a lookup uses the part of the match
in memory and every stored sequence is handed to it (it writes what was reused). Runs MLX:
engine thread only.
"""

from __future__ import annotations

import logging

import mlx.core as mx
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

from radixchat.core.cache.kv_format import KVFormat
from radixchat.core.cache.radix import Match, RadixCache
from radixchat.core.cache.rounded import RoundedKVCache, format_of

log = logging.getLogger("radixchat.prefix")


def _own(a):
    return mx.contiguous(a) if isinstance(a, mx.array) else a


def _nbytes(x) -> int:
    if isinstance(x, mx.array):
        return x.nbytes
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(v) for v in x)
    return 0


def _copy_state(x):
    if isinstance(x, (list, tuple)):
        return type(x)(_copy_state(v) for v in x)
    return _own(x)


class KVSegment:
    """Per layer, the K/V of a run of tokens as arrays whose token axis is the third: (K, V),
    or at a --kv-bits precision (K's codes, K's scales, V's codes, V's scales:
    core.cache.kv_format), which hold exactly what the batch attended over."""

    __slots__ = ("layers", "n", "nbytes")

    def __init__(self, layers: list[tuple[mx.array, ...] | None], n: int):
        self.layers = layers
        self.n = n
        self.nbytes = sum(a.nbytes for kv in layers if kv is not None for a in kv)

    @classmethod
    def from_caches(cls, caches, trimmable: list[bool], start: int, end: int, fmt: KVFormat | None = None) -> KVSegment:
        def own(c) -> tuple[mx.array, ...]:
            k, v = c.keys[..., start:end, :], c.values[..., start:end, :]
            return (*fmt.encode(k), *fmt.encode(v)) if fmt is not None else (_own(k), _own(v))

        layers = [own(c) if t else None for c, t in zip(caches, trimmable)]
        # async: the copy runs behind the decode step already queued instead of stalling it;
        # until it has run, the source buffer stays referenced by the graph, not by the tree
        mx.async_eval([kv for kv in layers if kv is not None])
        return cls(layers, end - start)

    def split(self, k: int) -> tuple[KVSegment, KVSegment]:
        def part(s, e):
            return [tuple(_own(a[..., s:e, :]) for a in kv) if kv else None for kv in self.layers]

        left, right = part(0, k), part(k, self.n)
        mx.async_eval([kv for kv in left + right if kv is not None])
        return KVSegment(left, k), KVSegment(right, self.n - k)


class Snapshot:
    """The full state of the non-trimmable layers at one token position.

    Kept as the cache protocol's round trip, (class, state, meta_state) in and
    `cls.from_state` out, so whatever fields a cache class keeps where survive. mlx-lm
    0.32 keeps all of them in `state` (a RotatingKVCache's offset, keep, max_size and _idx
    too) and has no `meta_state`; earlier releases kept those scalars in `meta_state`.
    """

    __slots__ = ("layers", "nbytes")

    def __init__(self, caches, trimmable: list[bool]):
        self.layers = [None if t else _capture(_windowed(c)) for c, t in zip(caches, trimmable)]
        mx.async_eval([s[1] for s in self.layers if s is not None])
        self.nbytes = sum(_nbytes(s[1]) for s in self.layers if s is not None)

    @classmethod
    def of_layers(cls, layers: list) -> Snapshot:
        """One read back from disk: (class, state, meta_state) or None per layer."""
        snap = cls.__new__(cls)
        snap.layers = layers
        snap.nbytes = sum(_nbytes(s[1]) for s in layers if s is not None)
        return snap

    def restore(self, i: int):
        # arrays are shared read-only: merging into the batch copies them
        cls, state, meta_state = self.layers[i]
        return cls.from_state(state) if meta_state is None else cls.from_state(state, meta_state)


def _capture(cache) -> tuple:
    """(class, own copy of state, meta_state or None where the class has none)."""
    return type(cache), _copy_state(cache.state), getattr(cache, "meta_state", None)


def _windowed(cache):
    """A RotatingKVCache cut to the last `max_size` tokens it holds; any other cache as is.

    A prefill of S tokens leaves max_size + S - 1 of them (each query of the chunk needs
    its own window), but every later step, and the batch merge, reads the last max_size
    only: uncut, each snapshot of a sliding-window layer would hold a whole prompt's K/V.
    """
    if not (isinstance(cache, RotatingKVCache) and cache.keep == 0 and cache.keys is not None):
        return cache
    n = cache.max_size
    if cache.keys.shape[2] <= n or cache._idx != cache.keys.shape[2]:  # short, or rotated in place
        return cache
    out = RotatingKVCache(n)
    out.keys, out.values = cache.keys[..., -n:, :], cache.values[..., -n:, :]
    out.offset, out._idx = cache.offset, n
    return out


class PrefixStore:
    def __init__(self, model, budget_bytes: int, fmt: KVFormat | None = None, kv_dtype: mx.Dtype | None = None):
        self.tree = RadixCache(budget_bytes)
        self.fmt = fmt  # the precision segments hold K/V at (None: as the batch holds it)
        self.classes = [type(c) for c in make_prompt_cache(model)]
        self.trimmable = [c in (KVCache, RoundedKVCache) for c in self.classes]
        self.kv_dtype = kv_dtype  # with a format, what codes decode to: the dtype core.cache.rounded.install saw
        self.hybrid = not all(self.trimmable)
        self.bytes_per_token = 0  # K/V bytes of one token of the running batch (its dtype), once known
        self.disk = None  # core.cache.disk.tier.DiskTier, when --cache-disk-bytes is set

    def lookup(self, key: list[int], min_length: int = 0) -> tuple[Match, list | None]:
        """Match a prompt's tree key (always leaving its last token to prefill), restore
        and lock. A match shorter than `min_length` is a miss."""
        m = self.tree.match(key[:-1], need_snapshot=self.hybrid, min_length=min_length)
        if m.length == 0:
            return m, None
        caches = self.tree.timed_restore(lambda: self._restore(m))
        self.tree.lock(m.node)
        return m, caches

    def to_read(self, key: list[int], min_length: int = 0) -> Match | None:
        """The match `lookup` would make if every node were in memory, when part of it is
        on disk only (else None): what the disk tier must read back first. Touches nothing."""
        m = self.tree.walk(key[:-1])
        if self.hybrid:  # as match(need_snapshot): end where a snapshot is, in memory or on disk
            while m.path and (
                m.path_lengths[-1] < len(m.path[-1].key)
                or not (m.path[-1].snapshot is not None or (m.path[-1].spilled and m.path[-1].disk.snap))
            ):
                m.path.pop()
                m.path_lengths.pop()
        m.length = sum(m.path_lengths)
        if m.length < max(1, min_length) or not any(n.spilled for n in m.path):
            return None
        return m

    def attach_disk(self, tier) -> None:
        """From now on, every stored node is also written to `tier` (core.cache.disk.tier.DiskTier)."""
        self.disk = tier

    def reserve(self, nbytes: int) -> None:
        """Count `nbytes` (the running batch's K/V) against the budget from the next insert on."""
        self.tree.reserved = nbytes

    def release(self, m: Match | None) -> None:
        if m is not None and m.node is not None:
            self.tree.unlock(m.node)

    def store(self, tokens: list[int], caches, by: object = None, keep: bool = False) -> bool:
        """Insert `tokens` (a tree key: see core.cache.scope) whose K/V (and states) are in
        `caches` (one request's, batch 1), stored by request `by` (see RadixCache.insert).
        `keep`: the disk tier writes all of it, reused or not (the warm-up's prompts)."""
        live = [c.offset for c, t in zip(caches, self.trimmable) if t]
        if any(n != len(tokens) for n in live) or not tokens:
            log.warning("not caching a sequence of %d tokens whose cache holds %s", len(tokens), live[:1])
            return False
        if not self.bytes_per_token:
            self.bytes_per_token = sum(2 * c.keys[..., :1, :].nbytes for c, t in zip(caches, self.trimmable) if t)
        snapshot = Snapshot(caches, self.trimmable) if self.hybrid else None
        node = self.tree.insert(
            tokens, lambda s, e: KVSegment.from_caches(caches, self.trimmable, s, e, self.fmt), snapshot, by
        )
        if self.disk is not None:
            self.disk.persist(node, keep)
        return True

    def _restore(self, m: Match) -> list:
        segs = self.tree.segments(m)
        out = []
        for i, trim in enumerate(self.trimmable):
            if not trim:
                out.append(m.node.snapshot.restore(i))
                continue
            # a segment taken whole is not sliced: a conversation's path is many segments,
            # and each slice is one more op for every layer
            arity = len(segs[0][0].layers[i])  # K, V; or K's and V's codes and scales
            parts = [
                [s.layers[i][j] if k == s.n else s.layers[i][j][..., :k, :] for s, k in segs] for j in range(arity)
            ]
            whole = [mx.concatenate(p, axis=2) if len(p) > 1 else p[0] for p in parts]
            if self.fmt is None:
                c = KVCache()
                c.keys, c.values = whole
            else:
                c = RoundedKVCache(self.fmt)
                c.keys = self.fmt.decode(whole[0], whole[1], self.kv_dtype)
                c.values = self.fmt.decode(whole[2], whole[3], self.kv_dtype)
            c.offset = m.length
            assert c.keys.shape[2] == c.offset, "restored cache must hold exactly its live tokens"
            out.append(c)
        return out  # lazy: the batch merge that consumes it evaluates it


def kv_bytes_per_token(model, codes: KVFormat | None = None) -> int:
    """K/V bytes one more token of one sequence costs, over every layer that keeps K/V (one
    token through a fresh cache, then the size of one position); with `codes`, its plain
    K/V layers at that format's planes (a decoding batch that holds codes:
    core.cache.batch.coded). Layers whose state does not grow with the sequence (SSM state)
    cost nothing per token."""
    caches = make_prompt_cache(model)
    model(mx.array([[0]]), cache=caches)
    total = 0
    for c in caches:
        keys, values = getattr(c, "keys", None), getattr(c, "values", None)
        if isinstance(keys, mx.array) and isinstance(values, mx.array) and keys.ndim == 4:
            k, v = keys[..., :1, :], values[..., :1, :]
            if codes is not None and format_of(c) is not None:
                total += sum(p.nbytes for p in (*codes.planes(k), *codes.planes(v)))
            else:
                total += k.nbytes + v.nbytes
    return max(1, total)
