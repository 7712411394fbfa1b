"""Caches that keep K/V at a --kv-bits precision: each token's K and V are written as their
round trip through the format (core.cache.kv_format), so every step attends over the numbers
the radix tree and the disk tier will hold of them.

Every write into a model's plain K/V goes through a cache's `update_and_fetch`: a prompt's
own cache (`RoundedKVCache`, which `install` makes the model's `make_cache` give where it
gave mlx-lm's `KVCache`), a batch of prompts being prefilled (`RoundedBatchKVCache`, what
those merge into) and the decoding batch (core.cache.batch.slots.SlotKVCache, which takes
the format from the batch it adopts). Each rounds what it is given, then stores it as the
library does. Sliding-window and other non-trimmable layers keep their own caches, at the
model's dtype (their snapshots are a window long, not a conversation).

Runs MLX: the engine thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache

from radixchat.core.cache.kv_format import KVFormat


class RoundedKVCache(KVCache):
    """mlx-lm's KVCache, writing K and V as `fmt` gives them back."""

    def __init__(self, fmt: KVFormat):
        super().__init__()
        self.fmt = fmt

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        return super().update_and_fetch(self.fmt.round_trip(keys), self.fmt.round_trip(values))

    def merge(self, caches: list[Any]) -> RoundedBatchKVCache:  # type: ignore[override]
        return RoundedBatchKVCache.merge(caches)


class RoundedBatchKVCache(BatchKVCache):
    """mlx-lm's BatchKVCache (a batch of prompts in prefill), writing K and V as `fmt` gives them back."""

    fmt: KVFormat

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        return super().update_and_fetch(self.fmt.round_trip(keys), self.fmt.round_trip(values))

    @classmethod
    def merge(cls, caches: list[Any]) -> RoundedBatchKVCache:
        merged = BatchKVCache.merge(caches)
        merged.__class__ = cls  # (the library makes a plain one when no cache holds anything yet)
        merged.fmt = next(f for c in caches if (f := format_of(c)) is not None)
        return merged  # type: ignore[return-value]


def refusal(model: Any, fmt: KVFormat) -> str | None:
    """Why `install` would refuse `model` at `fmt` (None: it would not), for the doctor."""
    return _refusal(_probe(model)[1], fmt)


def _probe(model: Any) -> tuple[Callable[[], list[Any]], list[KVCache]]:
    """The model's cache maker, and its plain K/V layers after one token went through them."""
    made: Callable[[], list[Any]] = getattr(model, "make_cache", None) or (lambda: [KVCache() for _ in model.layers])
    probe = model(mx.array([[0]]), cache=(caches := made()))
    del probe
    return made, [c for c in caches if type(c) is KVCache and c.keys is not None]


def _refusal(plain: list[KVCache], fmt: KVFormat) -> str | None:
    for c in plain:
        dims = (c.keys.shape[-1], c.values.shape[-1])
        if not all(fmt.fits(d) for d in dims):
            return (
                f"kv_bits {fmt.bits}: this model's heads ({dims[0]} numbers) do not split into the "
                f"{fmt.mode} format's groups of {fmt.group}; serve it with kv_bits 16"
                + (" or a kv_group_size that divides its heads" if fmt.name != fmt.mode else "")
            )
    return None


def format_of(cache: object) -> KVFormat | None:
    """The precision `cache` writes at (None: the model's dtype)."""
    return getattr(cache, "fmt", None)


def install(model: Any, fmt: KVFormat) -> mx.Dtype:
    """From now on the model's plain K/V layers get `RoundedKVCache`s (mlx-lm's
    `make_prompt_cache` asks the model's `make_cache` when it has one): the library's batch
    generator and this project's caches alike. Refuses a model whose heads the format's
    groups do not divide. Gives the dtype of the model's K/V (what codes decode to), seen in
    the same probe: one token through a fresh cache."""
    made, plain = _probe(model)
    dtype: mx.Dtype = plain[0].keys.dtype if plain else mx.float32
    if (why := _refusal(plain, fmt)) is not None:
        raise ValueError(why)

    def make_cache() -> list[Any]:
        return [RoundedKVCache(fmt) if type(c) is KVCache else c for c in made()]

    model.make_cache = make_cache
    return dtype
