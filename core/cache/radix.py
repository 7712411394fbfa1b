"""A token radix tree that holds KV segments: the shared prefix cache, without MLX.

Three small types: `Node` (an edge of tokens, its segment, an optional snapshot at its
end), `Match` (where a lookup stopped) and `RadixCache` (the tree, its locks, its byte
budget and LRU eviction). Eviction never walks the tree: the tree keeps the set of its
evictable leaves up to date, and `fit` orders only those. What a segment or a snapshot
*is* is left to the caller: the tree only needs `seg.split(k) -> (left, right)`,
`seg.nbytes` and `snap.nbytes`.
core/cache/kv.py supplies MLX segments (per-layer K/V slices); tests supply simulated ones.
No locks of its own: only the engine thread changes the tree (others read `summary`).

Invariants (asserted in `check`):
- a node's segment covers exactly its edge tokens; bytes counted = the sum of the live
  segments and snapshots (never buffer capacity);
- a node with lock_ref > 0 is never evicted, and lock_ref of a node >= that of any child;
- `evictable` is exactly the set of non-root nodes with no children and lock_ref == 0;
- after `insert` and `fit`, bytes <= budget unless every remaining leaf is locked.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable

_clock = itertools.count()


class Node:
    __slots__ = ("key", "seg", "snapshot", "children", "parent", "lock_ref", "last_access")

    def __init__(self, key: tuple[int, ...], seg: Any, parent: "Node | None"):
        self.key = key
        self.seg = seg
        self.snapshot: Any = None  # state of non-trimmable layers at the end of this edge
        self.children: dict[int, Node] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = next(_clock)

    @property
    def nbytes(self) -> int:
        return (self.seg.nbytes if self.seg is not None else 0) + (
            self.snapshot.nbytes if self.snapshot is not None else 0)


@dataclass
class Match:
    """A lookup result: `length` tokens are cached along `path` (root excluded).

    The last node may be used only partly: `path_lengths[i]` tokens of `path[i]`.
    `node` is the deepest node touched (lock it while the cache is in use).
    """
    length: int
    path: list[Node] = field(default_factory=list)
    path_lengths: list[int] = field(default_factory=list)

    @property
    def node(self) -> Node | None:
        return self.path[-1] if self.path else None


@dataclass
class Stats:
    hits: int = 0
    misses: int = 0
    hit_tokens: int = 0
    lookup_tokens: int = 0
    evictions: int = 0
    evicted_tokens: int = 0
    inserted_tokens: int = 0
    restore_s: float = 0.0


class RadixCache:
    def __init__(self, budget_bytes: int):
        self.root = Node((), None, None)
        self.root.lock_ref = 1  # the root is never evicted
        self.budget = budget_bytes
        self.bytes = 0
        self.reserved = 0  # bytes held outside the tree (the running batch) that share the budget
        self.tokens = 0
        self.nodes = 0
        self.locks = 0  # outstanding lock() calls: 0 whenever no request is running
        # unlocked leaves, kept current by every change to children or lock_ref, so that
        # fitting the budget costs O(evictable + evicted log n) instead of a walk of the tree
        self.evictable: set[Node] = set()
        self.stats = Stats()

    # ---- public API ----------------------------------------------------------------------

    def match(self, tokens: list[int], need_snapshot: bool = False, min_length: int = 0) -> Match:
        """Longest cached prefix of `tokens`. Touches the path (LRU); changes nothing else.

        With need_snapshot (a model with non-trimmable layers) the match only stops at the
        end of a node that carries a snapshot, backing off to the deepest such node. A match
        shorter than `min_length` is a miss (see core.cache.scope: a partial match of a
        shared system message must reveal nothing).
        """
        m = self._walk(tokens)
        if need_snapshot:
            while m.path and (m.path_lengths[-1] < len(m.path[-1].key) or m.path[-1].snapshot is None):
                m.path.pop()
                m.path_lengths.pop()
        if sum(m.path_lengths) < min_length:
            m.path, m.path_lengths = [], []
        m.length = sum(m.path_lengths)
        now = next(_clock)
        for n in m.path:
            n.last_access = now
        self.stats.lookup_tokens += len(tokens)
        if m.length:
            self.stats.hits += 1
            self.stats.hit_tokens += m.length
        else:
            self.stats.misses += 1
        return m

    def peek(self, tokens: list[int], min_length: int = 0) -> int:
        """Length of the longest cached prefix, touching nothing (no LRU, no stats)."""
        n = sum(self._walk(tokens).path_lengths)
        return n if n >= min_length else 0

    def insert(self, tokens: list[int], make_seg: Callable[[int, int], Any],
               snapshot: Any = None) -> Node:
        """Store `tokens`; `make_seg(start, end)` supplies the segment of a new edge.

        Splits a node where `tokens` leaves its edge. Attaches `snapshot` (if given) to
        the node ending at len(tokens). Then evicts to fit the budget (older entries first,
        the new one last). Returns that node, which may have been evicted if nothing else could.
        """
        node, i = self.root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                new = Node(tuple(tokens[i:]), make_seg(i, len(tokens)), node)
                node.children[tokens[i]] = new
                self._account(new, +1)
                self.evictable.discard(node)  # no longer a leaf
                self._refresh(new)
                self.stats.inserted_tokens += len(new.key)
                node, i = new, len(tokens)
                break
            n = common_prefix(child.key, tokens, i)
            if n < len(child.key):
                child = self._split(child, n)
            node, i = child, i + n
        node.last_access = next(_clock)
        if snapshot is not None and node is not self.root:
            if node.snapshot is not None:
                self.bytes -= node.snapshot.nbytes
            node.snapshot = snapshot
            self.bytes += snapshot.nbytes
        self.lock(node)  # evict older entries first...
        self.fit()
        self.unlock(node)
        self.fit()  # ...and the new one too if it still does not fit
        return node

    def lock(self, node: Node | None) -> None:
        """Protect `node` and its ancestors from eviction until `unlock(node)`."""
        if node is not None:
            self.locks += 1
        while node is not None:
            node.lock_ref += 1
            if node.lock_ref == 1:
                self.evictable.discard(node)
            node = node.parent

    def unlock(self, node: Node | None) -> None:
        if node is not None:
            self.locks -= 1
        while node is not None:
            node.lock_ref -= 1
            assert node.lock_ref >= 0, "unlock without lock"
            if node.lock_ref == 0:
                self._refresh(node)
            node = node.parent

    def fit(self, extra_bytes: int = 0) -> int:
        """Evict unlocked leaves, least recently used first, until bytes + extra <= budget."""
        extra_bytes += self.reserved
        if self.bytes + extra_bytes <= self.budget:
            return 0
        heap = [(n.last_access, id(n), n) for n in self.evictable]
        heapq.heapify(heap)
        freed = 0
        while heap and self.bytes + extra_bytes > self.budget:
            _, _, leaf = heapq.heappop(heap)
            freed += leaf.nbytes
            parent = self._evict(leaf)
            if parent in self.evictable:  # its last child went: LRU decides when it goes
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return freed

    def segments(self, m: Match) -> list[tuple[Any, int]]:
        """(segment, tokens to take from its start) along a match, root to leaf."""
        return [(n.seg, k) for n, k in zip(m.path, m.path_lengths)]

    def timed_restore(self, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            self.stats.restore_s += time.perf_counter() - t0

    def summary(self) -> dict:
        s = self.stats
        return {"nodes": self.nodes, "cached_tokens": self.tokens, "bytes": self.bytes,
                "budget": self.budget, "reserved": self.reserved, "locks": self.locks, "hits": s.hits, "misses": s.misses,
                "hit_tokens": s.hit_tokens, "lookup_tokens": s.lookup_tokens,
                "evictions": s.evictions, "evicted_tokens": s.evicted_tokens,
                "restore_ms": round(s.restore_s * 1e3, 3)}

    def check(self) -> None:
        """Assert the invariants (for tests; walks the whole tree)."""
        total = tokens = nodes = 0
        evictable = set()
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            nodes += 1
            tokens += len(n.key)
            total += n.nbytes
            assert n.key and n.parent.children[n.key[0]] is n
            assert n.lock_ref >= max((c.lock_ref for c in n.children.values()), default=0)
            if not n.children and n.lock_ref == 0:
                evictable.add(n)
            stack.extend(n.children.values())
        assert (total, tokens, nodes) == (self.bytes, self.tokens, self.nodes), \
            ((total, tokens, nodes), (self.bytes, self.tokens, self.nodes))
        assert evictable == self.evictable, (len(evictable), len(self.evictable))

    # ---- internals -------------------------------------------------------------------------

    def _walk(self, tokens: list[int]) -> Match:
        m = Match(0)
        node, i = self.root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            n = common_prefix(child.key, tokens, i)
            m.path.append(child)
            m.path_lengths.append(n)
            i += n
            if n < len(child.key):
                break
            node = child
        return m

    def _split(self, child: Node, k: int) -> Node:
        """Split `child`'s edge after k tokens; returns the new upper node."""
        left, right = child.seg.split(k) if child.seg is not None else (None, None)
        upper = Node(child.key[:k], left, child.parent)
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        child.parent.children[child.key[0]] = upper
        child.key, child.seg, child.parent = child.key[k:], right, upper
        upper.children[child.key[0]] = child
        self.nodes += 1  # bytes and tokens are unchanged by a split
        # `evictable` is unchanged too: upper has a child; child keeps its children and locks
        return upper

    def _refresh(self, node: Node) -> None:
        """Put `node` in or out of `evictable` after its children or lock_ref changed."""
        # the root has no parent; a node already evicted (a stale handle someone unlocks
        # late) is no longer its parent's child and must not come back
        attached = node.parent is not None and node.parent.children.get(node.key[0]) is node
        if attached and not node.children and node.lock_ref == 0:
            self.evictable.add(node)
        else:
            self.evictable.discard(node)

    def _evict(self, leaf: Node) -> Node:
        """Drop an evictable leaf from the tree; returns its parent."""
        parent = leaf.parent
        del parent.children[leaf.key[0]]
        self.evictable.discard(leaf)
        self._refresh(parent)
        self._account(leaf, -1)
        self.stats.evictions += 1
        self.stats.evicted_tokens += len(leaf.key)
        return parent

    def _account(self, node: Node, sign: int) -> None:
        self.bytes += sign * node.nbytes
        self.tokens += sign * len(node.key)
        self.nodes += sign


def common_prefix(key, tokens, start: int = 0) -> int:
    """How many leading items of `key` equal tokens[start:]."""
    n = 0
    limit = min(len(key), len(tokens) - start)
    while n < limit and key[n] == tokens[start + n]:
        n += 1
    return n
