"""core.engine.step.cpu_ops: the CPU forms of attention, SwiGLU and RoPE compute what mlx-lm's functions
compute (every mask shape mlx-lm passes, grouped and plain heads, decode and prefill), the
engine takes them only in its own thread and only with --cpu-ops, and an engine's greedy
tokens are the same with them on and off."""

from __future__ import annotations

import threading

import mlx.core as mx
import pytest
from mlx_lm.models.activations import swiglu as library_swiglu

from radixchat.core.config import Settings
from radixchat.core.engine.engine import Engine
from radixchat.core.engine.step import cpu_ops
from radixchat.core.seam.requests import ChatRequest, Finished

TOL = 2e-5


def library(q, k, v, scale, mask):
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


def qkv(batch: int, heads: int, kv_heads: int, length: int, total: int, seed: int = 0):
    mx.random.seed(seed)
    return (
        mx.random.normal((batch, heads, length, 16)),
        mx.random.normal((batch, kv_heads, total, 16)),
        mx.random.normal((batch, kv_heads, total, 16)),
    )


def causal(length: int, total: int) -> mx.array:
    return mx.arange(total - length, total)[:, None] >= mx.arange(total)[None]


@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (4, 4), (3, 1)])
@pytest.mark.parametrize("length,total", [(1, 23), (5, 23), (7, 7)])
def test_attention_equals_the_library_for_every_mask_form(heads, kv_heads, length, total):
    q, k, v = qkv(3, heads, kv_heads, length, total)
    # left padding as a batch cache has it: row i ignores its first 2*i positions
    padded = causal(length, total)[None, None] & (
        mx.arange(total)[None, None, None] >= 2 * mx.arange(3)[:, None, None, None]
    )
    additive = mx.where(padded, 0.0, -1e9)
    per_head = mx.broadcast_to(padded, (3, heads, length, total)) & (mx.arange(heads)[None, :, None, None] != 1)
    soft = mx.random.uniform(-3.0, 0.0, (3, 1, length, total))  # a bias, as ALiBi adds
    masks = {
        "none": None,
        "bool": padded,
        "additive": additive,
        "soft": soft,
        "per-head": per_head,
        "2-d": causal(length, total),
    }
    if length > 1:
        masks["causal"] = "causal"
    for name, mask in masks.items():
        want = library(q, k, v, 0.25, mask if mask != "causal" else causal(length, total))
        got = cpu_ops.attention(q, k, v, 0.25, mask)
        assert got.shape == want.shape, name
        assert mx.abs(got - want).max().item() < TOL, name


def test_swiglu_equals_the_library_including_saturated_gates():
    mx.random.seed(1)
    gate = mx.concatenate(
        [mx.random.normal((2, 64)) * 4, mx.array([[-200.0, -90.0, 0.0, 90.0, 200.0] * 4] * 2)], axis=1
    )
    x = mx.random.normal(gate.shape)
    want, got = library_swiglu(gate, x), cpu_ops.swiglu(gate, x)
    assert not mx.isnan(got).any().item()
    assert (mx.abs(got - want) <= 1e-6 * (1 + mx.abs(want))).all().item()


def test_the_fast_form_runs_only_in_a_thread_that_asked_for_it(tiny_model_dir, monkeypatch):
    from mlx_lm import load

    model, _ = load(str(tiny_model_dir))
    modules = cpu_ops.install(model)
    assert modules == ["mlx_lm.models.llama"]
    calls = []
    real = cpu_ops.attention
    monkeypatch.setattr(cpu_ops, "attention", lambda *a: calls.append(1) or real(*a))
    tokens = mx.array([[1, 2, 3, 4]])

    def forward(on: bool, out: list):
        cpu_ops.use_here(on)
        out.append(model(tokens))
        mx.eval(out)

    results: list = []
    for on in (False, True):
        t = threading.Thread(target=forward, args=(on, results))
        t.start()
        t.join()
        if not on:
            assert calls == [], "a thread that did not ask took the fast form"
    assert len(calls) == len(model.layers)
    assert mx.abs(results[0] - results[1]).max().item() < 1e-4


def greedy_replies(model_dir, on: bool) -> list[str]:
    eng = Engine(Settings(model=str(model_dir), cpu_ops=on, max_batch=8, max_tokens=20)).start(timeout=120)
    try:
        handles = [
            eng.submit(
                ChatRequest(
                    messages=[
                        {"role": "system", "content": "You answer questions about Python."},
                        {"role": "user", "content": f"Tell me about {w}" + " please" * (i % 3)},
                    ]
                )
            )
            for i, w in enumerate(["lists", "tuples", "dicts", "sets", "generators", "classes"])
        ]
        finals = [h.result() for h in handles]
        assert all(isinstance(f, Finished) for f in finals), finals
        return [f.text for f in finals]
    finally:
        eng.stop()


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_an_engine_answers_the_same_with_cpu_ops_on_and_off(tmp_path, arch):
    from tests.support.randmodel import build_random_model

    model_dir = build_random_model(tmp_path / arch, arch=arch, layers=2)
    off, on = greedy_replies(model_dir, False), greedy_replies(model_dir, True)
    assert on == off
    assert len(set(on)) > 1


def test_rope_from_the_steps_table_is_the_librarys_bit_for_bit(tiny_model_dir):
    """Within `shared_positions`, every layer's RoPE rotates by one table of the step's
    positions: the same numbers as mx.fast.rope, for one token a row and for several, and
    only for offsets of the caches it was given."""
    import mlx.nn as nn
    from mlx_lm import load
    from mlx_lm.models.cache import BatchKVCache, BatchRotatingKVCache

    model, _ = load(str(tiny_model_dir))
    cpu_ops.install(model)
    ropes = [layer.self_attn.rope for layer in model.model.layers]
    assert all(type(r) is cpu_ops.SharedRoPE for r in ropes)
    rope = ropes[0]
    caches = [BatchKVCache([0, 3, 7]) for _ in ropes]
    for c in caches:  # equal positions in every layer, each its own array, as a batch's layers
        c.offset = mx.array([40, 517, 9])
    stranger = mx.array([40, 517, 9])  # the same values, not a cache's: the library's
    mx.random.seed(3)
    used = []
    real = cpu_ops._Positions.table
    cpu_ops._Positions.table = lambda self, *a: used.append(1) or real(self, *a)
    try:
        cpu_ops.use_here(True)
        for length in (1, 4):
            used.clear()
            x = mx.random.normal((3, 2, length, rope.dims)) * 3
            want = mx.fast.rope(
                x, rope.dims, traditional=False, base=rope.base, scale=rope.scale, offset=caches[0].offset
            )
            with cpu_ops.shared_positions(caches):
                for c in caches:
                    assert mx.array_equal(rope(x, offset=c.offset), want).item()
                n = len(used)
                assert mx.array_equal(rope(x, offset=stranger), want).item()
                assert len(used) == n, "an offset that is not a cache's took the table"
            assert len(used) == len(caches)
        used.clear()
        window = BatchRotatingKVCache(8, [0, 3, 7])  # another class: its positions are its own
        window.offset = mx.array([40, 517, 9])
        with cpu_ops.shared_positions([*caches, window]):
            assert mx.array_equal(rope(x, offset=window.offset), want).item()
        assert used == [], "a cache of another class than the first took the table"
        half = x.astype(mx.float16)
        kw = {"traditional": False, "base": rope.base, "scale": rope.scale, "offset": caches[0].offset}
        with cpu_ops.shared_positions(caches):
            assert mx.array_equal(rope(half, offset=caches[0].offset), mx.fast.rope(half, rope.dims, **kw)).item()
        assert used == [], "half precision took the float32 table"
        cpu_ops.use_here(False)
        with cpu_ops.shared_positions(caches):
            rope(x, offset=caches[0].offset)
        assert used == [], "a thread that did not ask took the table"
    finally:
        cpu_ops._Positions.table = real
        cpu_ops.use_here(False)
    cpu_ops.uninstall(model)
    assert all(type(r) is nn.RoPE for r in ropes)
