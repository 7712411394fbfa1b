"""How far a prompt agrees with a cached edge: `common_prefix`, the comparison the radix
tree (core.cache.radix) walks by and the scheduler's shared-prefix wait (core.engine.prefix_use)
measures with. Pure Python, no MLX; any thread.
"""

from __future__ import annotations

CHUNK = 64  # items compared at once by `common_prefix`


def common_prefix(key, tokens, start: int = 0) -> int:
    """How many leading items of `key` equal tokens[start:]. Compared as slices, in C: the
    whole length first (an edge of a cached path matches whole), then chunk by chunk, and only
    the chunk where they differ item by item (in Python all along, a walk of a system prompt
    took tens of microseconds, and the scheduler walks the tree for every waiting request)."""
    limit = min(len(key), len(tokens) - start)
    cast = None if type(key) is type(tokens) else type(key)  # a node's key is a tuple, a prompt a list
    part = tokens[start : start + limit]
    if (cast(part) if cast is not None else part) == key[:limit]:
        return limit  # a walk down a cached path: every edge but the last matches whole
    n = 0
    while n < limit:
        m = min(n + CHUNK, limit)
        part = tokens[start + n : start + m]
        if (cast(part) if cast is not None else part) != key[n:m]:
            break
        n = m
    while n < limit and key[n] == tokens[start + n]:
        n += 1
    return n
