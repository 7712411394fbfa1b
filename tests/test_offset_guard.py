"""Offset value semantics of the batched KV caches (shared/seeds/004), and their repair."""

from __future__ import annotations

import functools

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.generate import BatchGenerator, generate_step
from mlx_lm.models import cache as mlc
from mlx_lm.models import llama

from radixchat.core.cache.batch.offset_guard import check_class, ensure_offset_semantics, repair_class

CLASSES = [mlc.BatchKVCache, mlc.BatchRotatingKVCache]


def method_names(cls):
    return list(check_class(cls))


@pytest.mark.parametrize(
    "cls, method", [(c, m) for c in CLASSES for m in method_names(c)], ids=lambda v: getattr(v, "__name__", v)
)
def test_installed_mlx_lm_keeps_captured_offset(cls, method):
    assert check_class(cls)[method], f"{cls.__name__}.{method} mutated a captured offset"


def test_startup_check_reports_ok_for_installed_version():
    assert ensure_offset_semantics() == {"BatchKVCache": "ok", "BatchRotatingKVCache": "ok"}


def _in_place(method):
    """Put the old bug back: apply the method's change to the offset array in place."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        old = self.offset
        out = method(self, *args, **kwargs)
        new = self.offset
        if new is not old and new.shape == old.shape:
            old += new - old  # the in-place update the seed write-up fixed
            self.offset = old
        return out

    return wrapper


def in_place_variant(base):
    """A test-only subclass of `base` whose offset-moving methods mutate in place."""
    ns = {m: _in_place(getattr(base, m)) for m in ("update_and_fetch", "prepare", "finalize", "trim")}

    def merge(cls, caches):
        merged = base.merge(caches)
        merged.__class__ = cls  # base.merge may hard-code its own class
        return merged

    ns["merge"] = classmethod(merge)
    return type(f"InPlace{base.__name__}", (base,), ns)


@pytest.mark.parametrize("base", CLASSES, ids=lambda c: c.__name__)
def test_check_catches_in_place_variant_and_repair_fixes_it(base):
    variant = in_place_variant(base)
    before = check_class(variant)
    assert not before["update_and_fetch"] and not before["trim"], before
    assert not all(before.values())
    report = ensure_offset_semantics([variant])
    assert report == {variant.__name__: "repaired"}
    assert all(check_class(variant).values())
    assert all(check_class(base).values()), "repairing a subclass must not touch its base"


# ---- model level: the gemma3n pattern --------------------------------------------------


class CapturingAttention(llama.Attention):
    """llama attention, but the query RoPE uses an offset captured before the cache update."""

    def __call__(self, x, mask=None, cache=None):
        from mlx_lm.models.base import scaled_dot_product_attention

        B, L, _ = x.shape
        q = self.q_proj(x).reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3)
        k = self.k_proj(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        offset = cache.offset  # captured: must keep this value through the update
        k = self.rope(k, offset=offset)
        k, v = cache.update_and_fetch(k, v)
        q = self.rope(q, offset=offset)
        out = scaled_dot_product_attention(q, k, v, cache=cache, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


def capturing_model(batch_cls, window: int | None):
    mx.random.seed(3)
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=97,
        tie_word_embeddings=False,
    )
    model = llama.Model(args)
    model.model.embed_tokens.weight = mx.random.normal((97, 64))
    for layer in model.model.layers:
        layer.self_attn.__class__ = CapturingAttention
        layer.self_attn.v_proj.weight = layer.self_attn.v_proj.weight * 2
    single = mlc.KVCache if window is None else functools.partial(mlc.RotatingKVCache, max_size=window)

    class Single(mlc.KVCache if window is None else mlc.RotatingKVCache):
        def merge(self, caches):
            return batch_cls.merge(caches)

    def make_cache():
        return [Single() if window is None else Single(max_size=window) for _ in model.layers]

    model.make_cache = make_cache
    model.single_cache = lambda: [single() for _ in model.layers]
    mx.eval(model.parameters())
    return model


PROMPTS = [[5, 9, 13, 2, 7, 11], [3, 4], [8, 1, 6, 10, 12, 14, 15, 16, 17], [20, 21, 22, 23]]
NEW = 14


def decode_alone(model, prompt):
    tokens = []
    for tok, _ in generate_step(mx.array(prompt), model, max_tokens=NEW, prompt_cache=model.single_cache()):
        tokens.append(int(tok))
    return tokens


def decode_batched(model, prompts):
    gen = BatchGenerator(model, max_tokens=NEW, completion_batch_size=8, prefill_batch_size=8)
    uids = gen.insert(prompts)
    out = {u: [] for u in uids}
    while any(len(v) < NEW for v in out.values()):
        for r in gen.next_generated():
            out[r.uid].append(r.token)
    return [out[u] for u in uids]


@pytest.mark.parametrize(
    "base, window",
    [(mlc.BatchKVCache, None), (mlc.BatchRotatingKVCache, 12)],
    ids=["BatchKVCache", "BatchRotatingKVCache"],
)
def test_captured_offset_model_batched_equals_alone(base, window):
    reference = [decode_alone(capturing_model(base, window), p) for p in PROMPTS]
    assert len({tuple(r) for r in reference}) == len(PROMPTS)

    assert decode_batched(capturing_model(base, window), PROMPTS) == reference

    broken = in_place_variant(base)
    diverged = decode_batched(capturing_model(broken, window), PROMPTS)
    assert diverged != reference, "the in-place variant should corrupt the captured offset"

    repair_class(broken)
    assert decode_batched(capturing_model(broken, window), PROMPTS) == reference


def test_attention_is_really_the_capturing_kind():
    model = capturing_model(mlc.BatchKVCache, None)
    assert all(isinstance(layer.self_attn, CapturingAttention) for layer in model.layers)
    assert isinstance(model, nn.Module)
