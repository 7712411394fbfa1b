"""How much memory the decoding batch's K/V buffers take, as arithmetic on their shape.

core.cache.batch.slots lays the batch's rows out in buffers; this module says what that layout
costs, and how much of the K/V budget and how many rows the batch may take, for the engine's
admission and preemption (core.engine.sched) and for the memory the server states
(core.platform.memory, `doctor`, the Server tab). Plain integers, no MLX, so
the web layer and `doctor` can use it; any thread.
"""

from __future__ import annotations

STEP = 256  # mlx-lm's KVCache.step: the most columns the buffers grow by at once
GRAIN = 32  # the fewest, and what their width is rounded to
BATCH_SHARE = 0.75  # of the K/V budget, the most the running batch may set aside


def over_cap(max_batch: int) -> int:
    """The hard batch limit: `max_batch` plus room for users below their fair share
    (core.engine.sched.admission lets them in over `max_batch`)."""
    return max_batch + max(1, max_batch // 4)


def batch_room(kv_budget: int) -> int:
    """K/V bytes the running batch may hold: most of the budget; the prefix cache keeps
    the rest at least (and evicts its unlocked entries to make room for the batch)."""
    return int(kv_budget * BATCH_SHARE)


def growth(window: int) -> int:
    """Columns the buffers grow by past a `window` of tokens: a quarter of it, so the copies of
    a re-lay stay a constant share of the writes, between GRAIN and STEP."""
    return max(GRAIN, min(STEP, window // 4))


def layout_tokens(rows: int, longest: int) -> int:
    """Token slots the live rows take when the longest holds `longest` tokens: every row is
    padded to the longest. The spare room beyond them is `spare_bound`'s."""
    return rows * longest


def spare_bound(layout: int, rows: int) -> int:
    """The most token slots the buffers hold for `rows` live rows taking `layout`
    (`layout_tokens`): under twice the rows (slots gives the rest back as rows leave), each
    with dead columns before the window up to the window and a GRAIN, the window, its growth
    (a quarter of it at most) and a GRAIN of rounding and of the step's own tokens."""
    return 2 * (9 * layout // 4 + 4 * GRAIN * max(rows, 1))
