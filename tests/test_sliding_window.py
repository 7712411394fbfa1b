"""Sliding-window layers (gemma3-style RotatingKVCache) in the prefix cache's snapshots.

The engine-level transparency test is in test_prefix_cache.py; these check one store
and one restore directly: the snapshot round trip keeps every field of the rotating
cache, holds no more than its window, and a restored cache continues exactly like one
that never left the model.
"""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

from radixchat.core.cache.kv import PrefixStore
from tests.support.randmodel import SLIDING_WINDOW, build_random_model


@pytest.fixture(scope="module")
def sliding(tmp_path_factory):
    model_dir = build_random_model(tmp_path_factory.mktemp("sliding") / "m", layers=4, arch="gemma3")
    model, _ = load(str(model_dir))
    return model


def prefill(model, tokens, cache=None):
    cache = cache if cache is not None else make_prompt_cache(model)
    logits = model(mx.array([tokens]), cache=cache)
    mx.eval(logits, [c.state for c in cache])
    return logits, cache


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(5, 390) for _ in range(n)]


def test_model_mixes_rotating_and_global_layers(sliding):
    kinds = [type(c) for c in make_prompt_cache(sliding)]
    assert kinds == [RotatingKVCache, KVCache] * 2
    assert PrefixStore(sliding, 1 << 30).hybrid


@pytest.mark.parametrize("n", [SLIDING_WINDOW // 2, 100])  # short, and wrapped 6 times over
def test_restored_rotating_cache_continues_like_the_original(sliding, n):
    seq, suffix = tokens(0, n), tokens(1, 30)
    _, full = prefill(sliding, seq)
    store = PrefixStore(sliding, budget_bytes=1 << 30)
    assert store.store(seq, full)
    m, restored = store.lookup(seq + suffix)
    assert m.length == n
    for c, f in zip(restored, full):
        assert type(c) is type(f) and c.offset == f.offset == n
        if isinstance(c, RotatingKVCache):  # the fields beside the arrays survive the trip
            assert (c.max_size, c.keep) == (SLIDING_WINDOW, 0)
            assert c.keys.shape[2] == min(n, SLIDING_WINDOW)  # its window, not the prompt
    logits, _ = prefill(sliding, suffix, restored)
    fresh, _ = prefill(sliding, seq + suffix)
    assert mx.allclose(logits[0], fresh[0, n:], atol=1e-4, rtol=1e-4).item()
    store.release(m)


def test_snapshot_of_a_long_prompt_costs_one_window(sliding):
    """A prefill leaves window + prompt - 1 tokens in a rotating cache; the tree keeps a window."""
    seq = tokens(2, 200)
    _, full = prefill(sliding, seq)
    assert full[0].keys.shape[2] > SLIDING_WINDOW  # the hazard: the whole prompt is there
    store = PrefixStore(sliding, budget_bytes=1 << 30)
    store.store(seq, full)
    (node,) = store.tree.root.children.values()
    per_token = sum(2 * c.keys[..., :1, :].nbytes for c in full if isinstance(c, RotatingKVCache))
    assert node.snapshot.nbytes == SLIDING_WINDOW * per_token
    store.tree.check()
