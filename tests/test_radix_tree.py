"""The radix tree alone (simulated segments, no model), against a brute-force model."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from radixchat.core.cache.radix import RadixCache
from tests.support.segments import BPT, SimSeg


def insert(tree, tokens, snapshot=None):
    return tree.insert(tokens, lambda s, e: SimSeg(tokens[s:e]), snapshot)


class Snap:
    nbytes = 7


def live_sequences(tree):
    """Every root-to-node token sequence stored in the tree."""
    out, stack = set(), [((), tree.root)]
    while stack:
        prefix, node = stack.pop()
        for child in node.children.values():
            seq = prefix + child.key
            assert child.seg.tokens == child.key  # the segment covers exactly its edge
            out.add(seq)
            stack.append((seq, child))
    return out


def leaves(tree):
    """Every leaf, by a walk of the whole tree (the brute force the tree must not need)."""
    stack = list(tree.root.children.values())
    while stack:
        n = stack.pop()
        if n.children:
            stack.extend(n.children.values())
        else:
            yield n


def lcp(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_split_and_match_partial():
    t = RadixCache(10**9)
    insert(t, [1, 2, 3, 4, 5])
    insert(t, [1, 2, 9])
    t.check()
    assert t.nodes == 3 and t.tokens == 6 and t.bytes == 6 * BPT
    m = t.match([1, 2, 3, 7])
    assert m.length == 3 and m.path_lengths == [2, 1]
    assert [seg.tokens[:k] for seg, k in t.segments(m)] == [(1, 2), (3,)]


def test_snapshot_match_backs_off_to_snapshot_boundary():
    t = RadixCache(10**9)
    insert(t, [1, 2, 3], snapshot=Snap())
    insert(t, [1, 2, 3, 4, 5, 6], snapshot=Snap())
    assert t.match([1, 2, 3, 4, 5, 6, 7], need_snapshot=True).length == 6
    assert t.match([1, 2, 3, 4, 5, 9], need_snapshot=True).length == 3  # mid-node: back off
    assert t.match([1, 2, 8], need_snapshot=True).length == 0
    assert t.match([1, 2, 3, 4, 5, 9]).length == 5  # trimmable layers can stop anywhere


def test_locked_path_survives_eviction_and_unlock_frees_it():
    t = RadixCache(budget_bytes=8 * BPT)
    insert(t, [1, 2, 3, 4])
    m = t.match([1, 2, 3, 4])
    t.lock(m.node)
    insert(t, [5, 6, 7, 8, 9, 10])  # over budget, but [1..4] is locked
    assert t.match([1, 2, 3, 4]).length == 4
    assert t.bytes <= t.budget or all(n.lock_ref for n in leaves(t))
    t.unlock(m.node)
    insert(t, [11, 12, 13, 14, 15])
    t.check()
    assert t.bytes <= t.budget


ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.lists(st.integers(0, 3), min_size=1, max_size=12)),
        st.tuples(st.just("match"), st.lists(st.integers(0, 3), min_size=0, max_size=12)),
        st.tuples(st.just("lock"), st.lists(st.integers(0, 3), min_size=1, max_size=12)),
        st.tuples(st.just("unlock"), st.integers(0, 10)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, budget_tokens=st.integers(4, 40))
def test_tree_against_brute_force(ops, budget_tokens):
    t = RadixCache(budget_tokens * BPT)
    locks = []  # (node, sequence it protects)
    for op, arg in ops:
        if op == "insert":
            insert(t, arg)
        elif op == "match":
            m = t.match(arg)
            # the match is the longest common prefix with any stored sequence
            assert m.length == max((lcp(arg, s) for s in live_sequences(t)), default=0)
        elif op == "lock":
            m = t.match(arg)
            if m.node is not None:
                t.lock(m.node)
                locks.append((m.node, arg[: m.length]))
        elif op == "unlock" and locks:
            node, _ = locks.pop(arg % len(locks))
            t.unlock(node)
        t.check()  # bytes == sum of live segments, lock_ref monotone, evictable set exact
        seqs = live_sequences(t)
        for _, protected in locks:  # a locked path is never evicted
            assert (
                not protected or tuple(protected) in seqs or any(s[: len(protected)] == tuple(protected) for s in seqs)
            )
        unlocked_leaves = [n for n in leaves(t) if n.lock_ref == 0]
        assert t.bytes <= t.budget or not unlocked_leaves
    for node, _ in locks:
        t.unlock(node)
    assert all(n.lock_ref == 0 for n in leaves(t)), "a lock leaked"
    assert t.locks == 0


class WatchedChildren(dict):
    """A children dict that counts enumerations: any walk of the tree must enumerate some."""

    walks = 0

    def values(self):
        WatchedChildren.walks += 1
        return super().values()

    def items(self):
        WatchedChildren.walks += 1
        return super().items()

    def __iter__(self):
        WatchedChildren.walks += 1
        return super().__iter__()


def watch(tree):
    stack = [tree.root]
    while stack:
        n = stack.pop()
        stack.extend(n.children.values())
        n.children = WatchedChildren(n.children)
    WatchedChildren.walks = 0


def test_eviction_never_walks_the_tree():
    """Many locked conversations and a few idle ones: fitting the budget orders the idle
    leaves only, it never enumerates the (mostly locked) tree."""
    t = RadixCache(budget_bytes=10**9)
    locked = [insert(t, [7, i, i + 1, i + 2]) for i in range(200)]
    for node in locked:
        t.lock(node)
    for i in range(5):
        insert(t, [8, i, i + 1])
    t.budget = t.bytes  # full: the next insert must evict
    watch(t)
    new = insert(t, [9, 1, 2, 3])
    assert WatchedChildren.walks == 0, "fit walked the tree"
    assert t.stats.evictions == 2  # the two oldest idle leaves make room for 4 tokens
    assert t.match([8, 0, 1]).length == 1 and t.match([8, 4, 5]).length == 3
    t.check()
    assert new in t.evictable and all(n.lock_ref == 0 for n in t.evictable)
    for node in locked:
        t.unlock(node)
    t.check()


def test_evictable_set_follows_split_lock_and_eviction():
    t = RadixCache(budget_bytes=10**9)
    a = insert(t, [1, 2, 3, 4])
    assert t.evictable == {a}
    b = insert(t, [1, 2, 9])  # splits a: the upper node [1, 2] is never a leaf
    upper = b.parent
    assert upper.key == (1, 2) and t.evictable == {a, b}
    t.lock(b)
    assert t.evictable == {a} and upper.lock_ref == 1
    t.budget = 0
    t.fit()  # a goes; upper still has the locked b
    assert t.evictable == set() and a.parent is upper and (3,) not in upper.children
    t.unlock(b)
    assert t.evictable == {b}
    t.fit()  # b goes, then upper (now an unlocked leaf), leaving an empty tree
    assert t.evictable == set() and t.nodes == 0 and t.bytes == 0
    t.lock(b)
    t.unlock(b)  # a stale handle: an evicted node must not come back
    assert t.evictable == set()
    t.check()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 3), max_size=300),
    st.lists(st.integers(0, 3), max_size=300),
    st.integers(0, 40),
    st.booleans(),
)
def test_common_prefix_compares_in_chunks_as_item_by_item(key, tokens, start, as_tuple):
    """The chunked comparison (a node's key is a tuple, a prompt a list) finds the same
    length as comparing item by item, at chunk boundaries and past the end of either."""
    from radixchat.core.cache.prefix_match import CHUNK, common_prefix

    start = min(start, len(tokens))
    tokens = tokens[:start] + key[: CHUNK * 2 + 3] + tokens[start:]  # long shared runs too
    k = tuple(key) if as_tuple else key
    assert common_prefix(k, tokens, start) == lcp(key, tokens[start:])


def test_an_edge_that_matches_whole_is_compared_in_one_slice():
    """The scheduler walks the tree for waiting prompts of hundreds of tokens: an edge they
    match whole is one comparison, not one per chunk."""
    from radixchat.core.cache.prefix_match import CHUNK, common_prefix

    class Key(tuple):
        slices = 0

        def __getitem__(self, i):
            Key.slices += isinstance(i, slice)
            return super().__getitem__(i)

    key = Key(range(CHUNK * 8))
    assert common_prefix(key, list(range(CHUNK * 8 + 5))) == CHUNK * 8
    assert Key.slices == 1


def test_a_node_counts_the_other_requests_that_went_through_it():
    """`hits`: what the disk tier writes (core/cache/disk/tier.py). A request's own second
    store (its prompt, then its whole sequence) is not a reuse; another request's is, and a
    split leaves both halves the count the node had, the half it goes through one more."""
    tree = RadixCache(1 << 30)

    def put(tokens, by):
        return tree.insert(tokens, lambda s, e: SimSeg(tokens[s:e]), None, by)

    prompt = put([1, 2, 3, 4], "a")
    assert put([1, 2, 3, 4, 5, 6], "a").parent is prompt and prompt.hits == 0
    other = put([1, 2, 9], "b")  # splits a's prompt after [1, 2]
    upper = other.parent
    assert upper.key == (1, 2) and upper.hits == 1 and prompt.key == (3, 4) and prompt.hits == 0
    assert other.hits == 0
    put([1, 2, 3, 4, 5, 6, 7], "c")
    assert (upper.hits, prompt.hits, other.hits) == (2, 1, 0)
    assert prompt.children[5].hits == 1  # a's reply: reused by c
