"""Offset value semantics for mlx-lm's batched KV caches: check, and repair where needed.

`BatchKVCache.offset` and `BatchRotatingKVCache.offset` are `mx.array`s. An in-place
`offset += n` changes every Python reference to that array, so a model that captured
`offset = cache.offset` before `update_and_fetch` (gemma3n does) silently sees the new
value (shared/seeds/004). mlx-lm 0.32.2 rebinds instead; older or other versions may not.

`check_class` exercises one class on tiny arrays, method by method, and tells whether a
captured offset keeps its value. `repair_class` patches the class's methods, process-wide,
to rebind `self.offset` to a fresh array before the original runs, so whatever it then
mutates in place is no longer what anyone captured. `ensure_offset_semantics` does both
for the two classes; the engine calls it at start-up and `doctor` prints its result.
`left_padding` is left alone: nothing aliases it.

Runs MLX: call it from the thread that owns MLX (the engine thread, or a CLI command).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import mlx.core as mx
from mlx_lm.models import cache as mlc

log = logging.getLogger("radixchat.offset_guard")

B, H, D = 2, 1, 4  # batch, kv heads, head dim of the probe arrays
MOVERS = ("update_and_fetch", "prepare", "finalize", "trim", "filter", "extend", "merge")
PATCHED_MARK = "_radixchat_rebinds"


def _kv(n: int, b: int = B) -> tuple[mx.array, mx.array]:
    x = mx.arange(b * H * n * D, dtype=mx.float32).reshape(b, H, n, D)
    return x, x + 1


def _new(cls, left_padding=(1, 0)):
    if issubclass(cls, mlc.BatchRotatingKVCache) or cls.__name__.endswith("RotatingKVCache"):
        return cls(max_size=8, left_padding=list(left_padding))
    return cls(left_padding=list(left_padding))


def _filled(cls, n: int = 3):
    c = _new(cls)
    c.update_and_fetch(*_kv(n))
    mx.eval(c.offset)
    return c


def _probes(cls) -> dict[str, Callable[[], tuple[object, Callable[[object], None]]]]:
    """name -> () -> (cache, action). The action moves the cache's offset."""

    def merged():
        single = mlc.RotatingKVCache(max_size=8) if "Rotating" in cls.__name__ else mlc.KVCache()
        single.update_and_fetch(*_kv(3, b=1))
        return cls.merge([single, single])

    def right_padded():
        c = _new(cls, (0, 0))
        c.prepare(lengths=[2, 3], right_padding=[1, 0])
        c.update_and_fetch(*_kv(3))
        return c

    probes = {
        "update_and_fetch": lambda: (_filled(cls), lambda c: c.update_and_fetch(*_kv(1))),
        "prepare(left)": lambda: (_new(cls, (0, 0)), lambda c: c.prepare(left_padding=[1, 2])),
        "prepare(right)": lambda: (_new(cls, (0, 0)), lambda c: c.prepare(lengths=[2, 3], right_padding=[1, 0])),
        "finalize": lambda: (right_padded(), lambda c: c.finalize()),
        "trim": lambda: (_filled(cls), lambda c: c.trim(1)),
        "filter": lambda: (_filled(cls), lambda c: c.filter([1])),
        "extend": lambda: (_filled(cls), lambda c: c.extend(_filled(cls))),
        # the offset a merge produced must survive the merged cache moving on
        "merge": lambda: (merged(), lambda c: c.update_and_fetch(*_kv(1))),
    }
    if "Rotating" in cls.__name__:
        # fill past max_size so the window rolls (both the concat and the in-place path)
        probes["roll(concat)"] = lambda: (_filled(cls, 7), lambda c: c.update_and_fetch(*_kv(4)))
        probes["roll(in place)"] = lambda: (_filled(cls, 8), lambda c: c.update_and_fetch(*_kv(1)))
    return probes


def check_class(cls) -> dict[str, bool]:
    """For each offset-moving method of `cls`: does a captured offset keep its value?"""
    results = {}
    for name, probe in _probes(cls).items():
        cache, action = probe()
        captured = cache.offset
        before = captured.tolist()
        action(cache)
        mx.eval(captured)
        results[name] = captured.tolist() == before
    return results


def _rebinding(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if isinstance(getattr(self, "offset", None), mx.array):
            # a fresh array object: in-place updates below can no longer reach captured ones
            self.offset = self.offset + 0
        return method(self, *args, **kwargs)

    return wrapper


def repair_class(cls) -> None:
    """Patch `cls` (for this process) so its methods rebind `offset` instead of mutating it."""
    if cls.__dict__.get(PATCHED_MARK):
        return
    for name in ("update_and_fetch", "prepare", "finalize", "trim", "filter", "extend"):
        setattr(cls, name, _rebinding(getattr(cls, name)))
    setattr(cls, PATCHED_MARK, True)


def ensure_offset_semantics(classes=None) -> dict[str, str]:
    """Check both batched cache classes; repair and re-check any that fail.

    Returns {class name: "ok" | "repaired" | "FAILED: methods"}.
    """
    classes = classes or (mlc.BatchKVCache, mlc.BatchRotatingKVCache)
    report = {}
    for cls in classes:
        bad = [m for m, ok in check_class(cls).items() if not ok]
        if not bad:
            report[cls.__name__] = "ok"
            continue
        repair_class(cls)
        still = [m for m, ok in check_class(cls).items() if not ok]
        report[cls.__name__] = f"FAILED: {', '.join(still)}" if still else "repaired"
        log.warning(
            "%s mutated a captured offset in place (%s); applied rebinding: %s",
            cls.__name__,
            ", ".join(bad),
            report[cls.__name__],
        )
    return report
