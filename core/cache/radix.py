"""A token radix tree that holds KV segments: the shared prefix cache, without MLX.

Three small types: `Node` (an edge of tokens, its segment, an optional snapshot at its
end), `Match` (where a lookup stopped) and `RadixCache` (the tree, its locks, its byte
budget and LRU eviction). Eviction never walks the tree: the tree keeps the set of its
evictable leaves up to date, and `fit` orders only those. What a segment or a snapshot
*is* is left to the caller: the tree only needs `seg.split(k) -> (left, right)`,
`seg.nbytes` and `snap.nbytes`.
core/cache/kv.py supplies MLX segments (per-layer K/V slices); tests supply simulated ones.
No locks of its own: only the engine thread changes the tree (others read `summary`).

Two tiers (core/cache/disk/tier.py): a node may also hold a `disk` reference (opaque here:
`split(k)`, `release()` and a `node` attribute the tree keeps pointing at its holder).
Evicting a node that has one only drops its K/V from memory ("spills" it): its key stays,
so matches still walk it, and the disk tier reads it back (`attach`). A node without one
is dropped as before, with any spilled nodes below it. Disk eviction (`fit_disk`) drops
disk references of unlocked leaves, least recently used first. A node counts the stores of
other requests that went through it (`hits`): the disk tier writes only what was reused.

Invariants (asserted in `check`):
- a node's segment covers exactly its edge tokens; bytes counted = the sum of the live
  segments and snapshots (never buffer capacity); `tokens`/`nodes` count nodes in memory,
  `disk_tokens`/`disk_nodes` the spilled ones (on disk only);
- a node with lock_ref > 0 is never evicted, and lock_ref of a node >= that of any child;
- `evictable` is exactly the set of non-root nodes in memory, with lock_ref == 0 and no
  child in memory; `disk_evictable` those with a disk reference, lock_ref == 0 and no child;
- after `insert` and `fit`, bytes <= budget unless every remaining leaf is locked.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from radixchat.core.cache.prefix_match import common_prefix

_clock = itertools.count()


class Node:
    __slots__ = (
        "by",
        "children",
        "disk",
        "hits",
        "key",
        "last_access",
        "lock_ref",
        "mem_children",
        "parent",
        "seg",
        "snapshot",
    )

    def __init__(self, key: tuple[int, ...], seg: Any, parent: Node | None):
        self.key = key
        self.seg = seg
        self.snapshot: Any = None  # state of non-trimmable layers at the end of this edge
        self.children: dict[int, Node] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = next(_clock)
        self.disk: Any = None  # its K/V's copy on disk (core.cache.disk.tier.DiskRef), if any
        self.mem_children = 0  # children not spilled (kept, so no refresh enumerates children)
        self.by: object = None  # the request whose stored sequence made it (see `insert`)
        self.hits = 0  # stores by other requests that went through it: has it been reused?

    @property
    def spilled(self) -> bool:
        """On disk only: its K/V must be read back before a restore can use it."""
        return self.seg is None and self.disk is not None

    @property
    def nbytes(self) -> int:
        return (self.seg.nbytes if self.seg is not None else 0) + (
            self.snapshot.nbytes if self.snapshot is not None else 0
        )


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
    spills: int = 0  # nodes whose K/V left memory for the disk copy


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
        self.disk_evictable: set[Node] = set()
        self.disk_tokens = 0  # tokens of spilled nodes (their keys only are in memory)
        self.disk_nodes = 0
        self.spill: Callable[[Node], None] | None = None  # see `attach_spill`
        self.stats = Stats()

    # ---- public API ----------------------------------------------------------------------

    def attach_spill(self, spill: Callable[[Node], None]) -> None:
        """Call `spill(node)` with a node about to be evicted that has no disk copy: the disk
        tier writes one there (core.cache.disk.tier), so the node is spilled instead of dropped."""
        self.spill = spill

    def match(self, tokens: list[int], need_snapshot: bool = False, min_length: int = 0) -> Match:
        """Longest cached prefix of `tokens`. Touches the path (LRU); changes nothing else.

        With need_snapshot (a model with non-trimmable layers) the match only stops at the
        end of a node that carries a snapshot, backing off to the deepest such node. A match
        shorter than `min_length` is a miss (see core.cache.scope: a partial match of a
        shared system message must reveal nothing).
        """
        m = self._walk(tokens)
        for i, n in enumerate(m.path):  # a restore needs K/V in memory: see `walk`
            if n.spilled:
                del m.path[i:], m.path_lengths[i:]
                break
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

    def walk(self, tokens: list[int]) -> Match:
        """The cached path of `tokens` through both tiers (spilled nodes too), touching
        nothing: what the disk tier must read back before `match` can use all of it."""
        m = self._walk(tokens)
        m.length = sum(m.path_lengths)
        return m

    def peek(self, tokens: list[int], min_length: int = 0) -> int:
        """Length of the longest cached prefix, touching nothing (no LRU, no stats)."""
        n = sum(self._walk(tokens).path_lengths)
        return n if n >= min_length else 0

    def insert(
        self, tokens: list[int], make_seg: Callable[[int, int], Any], snapshot: Any = None, by: object = None
    ) -> Node:
        """Store `tokens`; `make_seg(start, end)` supplies the segment of a new edge.

        Splits a node where `tokens` leaves its edge. Attaches `snapshot` (if given) to
        the node ending at len(tokens). Then evicts to fit the budget (older entries first,
        the new one last). Returns that node, which may have been evicted if nothing else could.
        `by` names the request storing (a request stores its prompt, then its whole
        sequence): every node it goes through that another request made counts a hit, so
        the disk tier can tell a reused node from one stored once (None: always another).
        """
        node, i = self.root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                new = Node(tuple(tokens[i:]), make_seg(i, len(tokens)), node)
                new.by = by
                node.children[tokens[i]] = new
                node.mem_children += 1
                self._account(new, +1)
                self._refresh(node)  # no longer a leaf
                self._refresh(new)
                self.stats.inserted_tokens += len(new.key)
                node, i = new, len(tokens)
                break
            n = common_prefix(child.key, tokens, i)
            if n < len(child.key):
                child = self._split(child, n)
            if by is None or child.by != by:
                child.hits += 1
            if child.spilled:  # its K/V is at hand again: no read from disk next time
                self.attach(child, make_seg(i, i + n))
            node, i = child, i + n
        node.last_access = next(_clock)
        if snapshot is not None and node is not self.root:
            if node.disk is not None and not getattr(node.disk, "snap", False):
                self.set_disk(node, None)  # written without it: written again, with it
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
                self.disk_evictable.discard(node)
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
            if leaf not in self.evictable:  # dropped with a subtree meanwhile
                continue
            freed += leaf.nbytes
            parent = self._evict(leaf)
            if parent in self.evictable:  # its last child went: LRU decides when it goes
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return freed

    # ---- the disk tier's side (core/cache/disk/tier.py) -----------------------------------------

    def attach(self, node: Node, seg: Any, snapshot: Any = None) -> None:
        """A spilled node's K/V is back in memory (read from disk, or recomputed)."""
        assert node.spilled
        self.disk_tokens -= len(node.key)
        self.disk_nodes -= 1
        node.seg, node.snapshot = seg, snapshot
        node.parent.mem_children += 1
        self._account(node, +1)
        self._refresh(node)
        self._refresh(node.parent)

    def set_disk(self, node: Node, ref: Any) -> None:
        """Give a node in memory its disk copy, or take it away (None)."""
        assert not node.spilled
        if node.disk is not None:
            node.disk.release()
        node.disk = ref
        if ref is not None:
            ref.node = node
        self._refresh(node)

    def adopt(self, tokens: list[int], start: int, make_ref: Callable[[int, int], Any]) -> bool:
        """Place an entry of the disk tier: `tokens[start:]`, whose K/V is on disk, under
        the cached `tokens[:start]`; `make_ref(s, e)` names tokens s..e of it. Spilled
        nodes come of it. False when `tokens[:start]` is not in the tree (an orphan) or
        all of `tokens` already is (a duplicate): nothing then refers to the entry."""
        node, i = self.root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                if i < start:
                    return False
                new = Node(tuple(tokens[i:]), None, node)
                node.children[tokens[i]] = new
                new.disk = make_ref(i, len(tokens))
                new.disk.node = new
                self.disk_tokens += len(new.key)
                self.disk_nodes += 1
                self._refresh(node)
                self._refresh(new)
                return True
            n = common_prefix(child.key, tokens, i)
            if n < len(child.key):
                if i + n < start or i + n == len(tokens):
                    return False
                child = self._split(child, n)
            node, i = child, i + n
        return False

    def fit_disk(self, over: Callable[[], bool], pick: Callable[[Node], bool] | None = None) -> int:
        """While `over()`, drop the disk copies of unlocked leaves, least recently used
        first: a spilled leaf leaves the tree, one in memory only loses its copy. With
        `pick`, only leaves it accepts (one owner's, say) are dropped."""
        dropped = 0
        heap = [(n.last_access, id(n), n) for n in self.disk_evictable if pick is None or pick(n)]
        heapq.heapify(heap)
        while heap and over():
            _, _, leaf = heapq.heappop(heap)
            if leaf not in self.disk_evictable:
                continue
            parent = leaf.parent
            if leaf.spilled:
                self._drop(leaf)
            else:
                self.set_disk(leaf, None)
            dropped += 1
            if parent in self.disk_evictable and (pick is None or pick(parent)):
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return dropped

    def drop(self, node: Node) -> None:
        """Take `node` and everything below it out of the tree (its disk copy was lost).
        Holders of locks below it unlock as usual; nothing there is matched again."""
        if node.parent is not None and node.parent.children.get(node.key[0]) is node:
            self._drop(node)

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
        return {
            "nodes": self.nodes,
            "cached_tokens": self.tokens,
            "bytes": self.bytes,
            "disk_nodes": self.disk_nodes,
            "disk_tokens": self.disk_tokens,
            "spills": s.spills,
            "budget": self.budget,
            "reserved": self.reserved,
            "locks": self.locks,
            "hits": s.hits,
            "misses": s.misses,
            "hit_tokens": s.hit_tokens,
            "lookup_tokens": s.lookup_tokens,
            "evictions": s.evictions,
            "evicted_tokens": s.evicted_tokens,
            "restore_ms": round(s.restore_s * 1e3, 3),
        }

    def check(self) -> None:
        """Assert the invariants (for tests; walks the whole tree)."""
        total = tokens = nodes = disk_tokens = disk_nodes = 0
        evictable, disk_evictable = set(), set()
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            if n.spilled:
                disk_nodes += 1
                disk_tokens += len(n.key)
                assert n.snapshot is None
            else:
                nodes += 1
                tokens += len(n.key)
                total += n.nbytes
                if n.lock_ref == 0 and n.mem_children == 0:
                    evictable.add(n)
            if n.disk is not None:
                assert n.disk.node is n and getattr(n.disk, "n", len(n.key)) == len(n.key)
                if n.lock_ref == 0 and not n.children:
                    disk_evictable.add(n)
            assert n.key and n.parent.children[n.key[0]] is n
            assert n.mem_children == sum(not c.spilled for c in n.children.values())
            assert n.lock_ref >= max((c.lock_ref for c in n.children.values()), default=0)
            stack.extend(n.children.values())
        assert (total, tokens, nodes) == (self.bytes, self.tokens, self.nodes), (
            (total, tokens, nodes),
            (self.bytes, self.tokens, self.nodes),
        )
        assert (disk_tokens, disk_nodes) == (self.disk_tokens, self.disk_nodes)
        assert evictable == self.evictable, (len(evictable), len(self.evictable))
        assert disk_evictable == self.disk_evictable, (len(disk_evictable), len(self.disk_evictable))

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
        upper.by, upper.hits = child.by, child.hits
        child.parent.children[child.key[0]] = upper
        child.key, child.seg, child.parent = child.key[k:], right, upper
        upper.children[child.key[0]] = child
        if child.disk is not None:  # both halves keep reading the same file, no I/O
            upper.disk, child.disk = child.disk.split(k)
            upper.disk.node, child.disk.node = upper, child
        if child.spilled:  # bytes and tokens are unchanged by a split
            self.disk_nodes += 1
        else:
            self.nodes += 1
            upper.mem_children = 1
        self._refresh(upper)  # it has a child now; child keeps its children and locks
        return upper

    def _refresh(self, node: Node) -> None:
        """Put `node` in or out of `evictable` after its children or lock_ref changed."""
        # the root has no parent; a node already evicted (a stale handle someone unlocks
        # late) is no longer its parent's child and must not come back
        attached = node.parent is not None and node.parent.children.get(node.key[0]) is node
        free = attached and node.lock_ref == 0
        if free and not node.spilled and node.mem_children == 0:
            self.evictable.add(node)
        else:
            self.evictable.discard(node)
        if free and node.disk is not None and not node.children:
            self.disk_evictable.add(node)
        else:
            self.disk_evictable.discard(node)

    def _evict(self, leaf: Node) -> Node:
        """Free an evictable node's memory: spill it if it has a disk copy, else drop it
        (with the spilled nodes under it, which nothing could reach then). Returns its parent."""
        parent = leaf.parent
        if leaf.disk is None and self.spill is not None:
            self.spill(leaf)
        if leaf.disk is not None:
            self._account(leaf, -1)
            leaf.seg = leaf.snapshot = None
            parent.mem_children -= 1
            self.disk_tokens += len(leaf.key)
            self.disk_nodes += 1
            self.stats.spills += 1
            self._refresh(leaf)
            self._refresh(parent)
        else:
            self._drop(leaf)
        return parent

    def _drop(self, top: Node) -> None:
        """Remove `top` and its subtree; their disk references are released."""
        parent = top.parent
        del parent.children[top.key[0]]
        if not top.spilled:
            parent.mem_children -= 1
        stack = [top]
        while stack:
            n = stack.pop()
            if n.children:  # (a leaf, usually: its dict is not even enumerated)
                stack.extend(n.children.values())
                n.children = {}  # so a late unlock below finds it detached (see _refresh)
            self.evictable.discard(n)
            self.disk_evictable.discard(n)
            if n.spilled:
                self.disk_tokens -= len(n.key)
                self.disk_nodes -= 1
            else:
                self._account(n, -1)
            if n.disk is not None:
                n.disk.release()
                n.disk = None
            self.stats.evictions += 1
            self.stats.evicted_tokens += len(n.key)
        self._refresh(parent)

    def _account(self, node: Node, sign: int) -> None:
        self.bytes += sign * node.nbytes
        self.tokens += sign * len(node.key)
        self.nodes += sign
