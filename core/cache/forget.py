"""Forgetting in the prefix cache: one owner's namespace (a removed user's), or the prompts
that begin a certain way (a deleted conversation's).

Owns `forget`: the nodes whose edge holds a token of the owner's namespace (core/cache/
scope.py tags them) leave the tree with everything below them, which is theirs too (a key
is one request's: once it enters the owner's namespace it stays there). A node whose edge
starts in the shared part (a system message) and runs into theirs is split first, so the
shared head stays cached. Dropping a node releases its disk reference, and a file nothing
refers to any more is deleted (core/cache/disk/tier.py). A file of theirs may still be referred
to from above them, by a shared node split off the edge it was written for (its key, and
so the file, holds their tokens too): that node keeps its K/V in memory without a copy, or,
spilled (its K/V in that file alone), goes with what hangs below it. A locked node (a running request's path, a read from disk under way)
leaves the tree at once as well: its holder unlocks it later as usual, and nothing matches
it again. Keeping the owner's requests from storing anything afterwards is the engine's
(core/engine/prefix_use.py).

Owns `forget_below` too: a deleted conversation's prompts all begin with its first turn (its
system message and first user message, templated), so what is cached below that key, from
where the path last branches off to something else, is reached by no other prompt and goes,
the same way; a shared head (the system message, or a beginning another conversation has
too) stays.

Left to others: which tag is whose (scope.py), the tree itself (radix.py: this module uses
its `_split`, `set_disk` and `drop`), the files (core.cache.disk.tier; of a node's reference this module
reads only which file it is and what else refers to that file, files.py). Engine thread only, as the tree.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from radixchat.core.cache.radix import Node, RadixCache


def forget(tree: RadixCache, theirs: Callable[[int], bool]) -> int:
    """Drop every node holding a token for which `theirs(token)` is true, with what hangs
    below it; returns how many tokens of the tree (in memory or on disk) went."""
    return _drop(tree, _their_tops(tree, theirs))


def forget_below(tree: RadixCache, key: list[int], start: int) -> int:
    """Drop what is cached of prompts that begin with all of `key`, from the point where the
    path to it last branches (or from `start`, the end of what is shared by design, if that
    is further down) with what hangs below; nothing when `key` is not cached whole (its
    beginning, if cached, is then someone else's prompt too). Returns the tokens dropped."""
    m = tree.walk(key)
    if m.length < len(key) or len(key) <= start:
        return 0
    ends = list(itertools.accumulate(len(n.key) for n in m.path))  # where each edge ends in `key`
    t = len(m.path) - 1
    # up while the node above leads here alone and holds tokens past `start`
    while t > 0 and len(m.path[t - 1].children) == 1 and ends[t - 1] > start:
        t -= 1
    top, begins = m.path[t], ends[t] - len(m.path[t].key)
    if begins < start and not top.spilled:
        tree._split(top, start - begins)  # `top` is the lower part now: past `start` alone
    return _drop(tree, [top])


def _drop(tree: RadixCache, tops: list[Node]) -> int:
    """Drop `tops` with what hangs below them, and their files; the tokens that went."""
    files, stack = set(), list(tops)
    while stack:  # their files, found before dropping empties the subtrees
        node = stack.pop()
        if node.disk is not None:
            files.add(node.disk.file)
        stack.extend(node.children.values())
    before = tree.tokens + tree.disk_tokens
    for node in tops:
        tree.drop(node)
    for f in files:  # a split left a shared node above them a range of one of their files
        for ref in list(f.refs):
            if ref.node.spilled:  # its K/V is in that file alone: it goes, with what is below
                tree.drop(ref.node)
            else:
                tree.set_disk(ref.node, None)
        if f.refs:  # held by nodes no longer in the tree, which nothing reads again
            f.refs.clear()
            f.unused(f)
    return before - (tree.tokens + tree.disk_tokens)


def _their_tops(tree: RadixCache, theirs: Callable[[int], bool]) -> list[Node]:
    """The highest nodes that hold the owner's tokens, a shared head split off each first."""
    tops, stack = [], [tree.root]
    while stack:
        node = stack.pop()
        for child in list(node.children.values()):
            at = next((i for i, t in enumerate(child.key) if theirs(t)), None)
            if at is None:
                stack.append(child)
                continue
            if at > 0 and not child.spilled:
                tree._split(child, at)  # `child` is the lower part now: theirs alone
            tops.append(child)
    return tops
