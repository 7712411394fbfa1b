"""The batched step leaves logits unnormalized; samplers and reported log-probabilities do not care."""

from __future__ import annotations

import threading

import mlx.core as mx
import pytest

from radixchat.core.engine.sample.sampling import make_request_sampler
from radixchat.core.engine.step import unnormalized
from radixchat.core.seam.requests import ChatRequest, Finished, Sampling

SAMPLINGS = [
    {"temperature": 0.8, "seed": 1},
    {"temperature": 1.0, "top_p": 0.3, "seed": 2},
    {"temperature": 1.0, "top_p": 0.9, "seed": 3},
    {"temperature": 0.7, "top_k": 5, "seed": 4},
    {"temperature": 0.9, "top_p": 0.5, "top_k": 20, "logit_bias": {3: 4.0}, "seed": 5},
    {"temperature": 0, "logit_bias": {7: 2.5}},
]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=lambda s: "-".join(sorted(s)))
@pytest.mark.parametrize("shift", [-30.0, 9.0, 95.0])  # exp(95) overflows float32
def test_a_sampler_draws_the_same_tokens_from_logits_shifted_by_a_constant(sampling, shift):
    mx.random.seed(0)
    logprobs = mx.random.normal((1, 64)) * 3
    logprobs = logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)
    s = Sampling(**sampling)
    normal, shifted = make_request_sampler(s), make_request_sampler(s)
    drawn = [(normal(logprobs).item(), shifted(logprobs + shift).item()) for _ in range(40)]
    assert [a for a, _ in drawn] == [b for _, b in drawn]
    assert len({a for a, _ in drawn}) > 1 or s.temperature == 0 or s.top_p <= 0.5


def test_the_steps_logsumexp_is_zero_only_in_a_thread_that_asked():
    generate = unnormalized.step_module()
    unnormalized.install()
    unnormalized.install()  # idempotent
    x = mx.array([[1.0, 2.0, 3.0]])
    seen = {}

    def engine_thread():
        unnormalized.use_here(True)
        seen["engine"] = generate.mx.logsumexp(x, axis=-1, keepdims=True).item()

    t = threading.Thread(target=engine_thread)
    t.start()
    t.join()
    assert seen["engine"] == 0.0
    assert abs(generate.mx.logsumexp(x, axis=-1, keepdims=True).item() - mx.logsumexp(x).item()) < 1e-6
    assert generate.mx.array is mx.array and generate.mx.library is mx


def test_reported_log_probabilities_are_mlx_lms_normalized_ones(engine, tiny_model_dir):
    """The engine's step skips the normalization; a request's logprobs must not show it."""
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    messages = [
        {"role": "system", "content": "You answer questions about Python."},
        {"role": "user", "content": "Tell me about sets"},
    ]
    final = engine.submit(
        ChatRequest(messages=messages, sampling={"max_tokens": 6, "ignore_eos": True, "logprobs": 2})
    ).result()
    assert isinstance(final, Finished) and len(final.logprobs) == 6

    model, tok = load(str(tiny_model_dir))
    prompt = mx.array(tok.apply_chat_template(messages, add_generation_prompt=True))
    want = []
    for (token, logprobs), _ in zip(generate_step(prompt, model), range(6)):
        want.append((logprobs[token].item(), mx.sort(logprobs)[-2:].tolist()[::-1]))
    for got, (chosen, top) in zip(final.logprobs, want):
        assert abs(got.logprob - chosen) < 1e-3, (got.logprob, chosen)
        assert [round(v, 3) for _, v in got.top] == [round(v, 3) for v in top]


def test_the_prompt_step_leaves_mlxs_buffer_cache_to_its_limit(engine, monkeypatch):
    """mlx-lm's prompt step emptied MLX's buffer cache after every chunk; in the engine
    thread it no longer does (the cache has a limit), and elsewhere it still does."""
    calls = []
    real = mx.clear_cache
    monkeypatch.setattr(mx, "clear_cache", lambda: calls.append(threading.current_thread().name) or real())
    long = "Tell me everything about generators. " * 12  # more than a chunk: prefills in several
    # (a system prompt of its own, so the engine shared with other modules caches nothing theirs match)
    messages = [{"role": "system", "content": "Be long."}, {"role": "user", "content": long}]
    final = engine.submit(ChatRequest(messages=messages, sampling={"max_tokens": 4}))
    assert isinstance(final.result(), Finished)
    assert calls == []
    unnormalized.step_module().mx.clear_cache()  # another thread: the library's own
    assert calls == [threading.current_thread().name]
