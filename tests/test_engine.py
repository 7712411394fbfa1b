"""The engine on a tiny random model: batching, cancel, bad requests, failure isolation."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from radixchat.core.engine.engine import INTERNAL_ERROR
from radixchat.core.seam.requests import ChatRequest, Failed, Finished, PromptRequest, RequestError, TextDelta

WORDS = ["lists", "tuples", "dicts", "sets", "generators", "classes", "modules", "strings"]


def chat(word: str, **sampling) -> ChatRequest:
    return ChatRequest(
        messages=[
            {"role": "system", "content": "You answer questions about Python."},
            {"role": "user", "content": f"Tell me about {word}"},
        ],
        sampling=sampling,
    )


def run_alone(engine, req) -> Finished:
    final = engine.submit(req).result()
    assert isinstance(final, Finished), final
    return final


def test_eight_threads_at_once_match_alone(engine):
    alone = [run_alone(engine, chat(w)).text for w in WORDS]
    steps_alone = engine.steps

    results: dict[int, Finished] = {}
    barrier = threading.Barrier(len(WORDS))

    def worker(i):
        barrier.wait()
        results[i] = engine.submit(chat(WORDS[i])).result()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(WORDS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    batched_steps = engine.steps - steps_alone

    assert sorted(results) == list(range(len(WORDS)))
    assert all(isinstance(r, Finished) for r in results.values())
    assert [results[i].text for i in range(len(WORDS))] == alone
    assert len(set(alone)) > 1, "each prompt should get its own answer"
    # they really shared steps: alone took ~one step per token, batched far fewer in all
    assert batched_steps < steps_alone / 2, (batched_steps, steps_alone)


def test_another_users_logit_bias_and_logprobs_leave_my_reply_alone(engine):
    """Biased and logprob-reporting rows sample through their own sampler in the same batch."""
    mine = [run_alone(engine, chat(w, max_tokens=12)).text for w in WORDS[:3]]
    barrier = threading.Barrier(6)
    results: dict[int, Finished] = {}

    def worker(i):
        barrier.wait()
        extra = (
            {}
            if i < 3
            else {
                "logit_bias": {t: 100 for t in range(5 + i, 8 + i)},
                "logprobs": 3,
                "temperature": 0.9 if i == 5 else 0,
            }
        )
        results[i] = engine.submit(chat(WORDS[i % 3], max_tokens=12, **extra)).result()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [results[i].text for i in range(3)] == mine
    assert all(results[i].logprobs is None for i in range(3))
    for i in range(3, 6):  # theirs: only their favoured tokens, each reported with 3 alternatives
        lps = results[i].logprobs
        assert lps and all(len(e.top) == 3 for e in lps) and results[i].text != mine[i % 3]


def test_penalties_break_loops_in_their_own_row_and_leave_the_others_alone(engine):
    """Penalized rows go through mlx-lm's logits processors in the same batch as plain ones:
    theirs repeat less, the plain replies are the ones they are alone, and a penalty of 0
    (or 1, the multiplicative one) is no penalty."""
    base = [run_alone(engine, chat(w, max_tokens=32)).text for w in WORDS[:3]]
    off = [
        run_alone(engine, chat(w, max_tokens=32, presence_penalty=0, repetition_penalty=1.0)).text for w in WORDS[:3]
    ]
    assert off == base
    barrier, results = threading.Barrier(6), {}

    def worker(i):
        barrier.wait()
        extra = {"presence_penalty": 1.5, "repetition_penalty": 1.8, "frequency_penalty": 0.5} if i >= 3 else {}
        results[i] = engine.submit(chat(WORDS[i % 3], max_tokens=32, **extra)).result()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [results[i].text for i in range(3)] == base

    def repeats(texts):
        return sum(len(ids) - len(set(ids)) for ids in (engine.tokenize(t) for t in texts))

    assert repeats(results[i].text for i in range(3, 6)) < repeats(base), (base, [results[i].text for i in (3, 4, 5)])


def test_min_p_keeps_only_the_likeliest_tokens(engine):
    """min_p 1 keeps only the likeliest token: a hot, seeded sample is then the greedy reply."""
    greedy = [run_alone(engine, chat(w, max_tokens=16)).text for w in WORDS[:3]]
    hot = [run_alone(engine, chat(w, max_tokens=16, temperature=1.5, seed=7)).text for w in WORDS[:3]]
    kept = [run_alone(engine, chat(w, max_tokens=16, temperature=1.5, seed=7, min_p=1.0)).text for w in WORDS[:3]]
    assert kept == greedy and hot != greedy


def test_a_schema_compiles_in_a_worker_thread_never_the_engines_or_the_loops(engine, monkeypatch):
    """However long a user's schema takes to compile, no other stream waits for it."""
    import radixchat.core.engine.sample.constrain as constrain

    threads, real = [], constrain.grammar_for

    def watched(schema):
        threads.append(threading.current_thread().name)
        return real(schema)

    monkeypatch.setattr(constrain, "grammar_for", watched)

    async def main():
        loop_thread = threading.current_thread().name
        # a schema no other test sends: a user's schema sent again is not compiled again
        schema = {"type": "object", "description": "compiled in a worker thread"}
        h = await engine.asubmit(chat("lists", max_tokens=20, json_schema=schema))
        return loop_thread, [ev async for ev in h][-1]

    loop_thread, final = asyncio.run(main())
    assert isinstance(final, Finished) and len(threads) == 1
    assert threads[0] not in ("radixchat-engine", loop_thread), threads


def test_a_body_longer_than_the_context_can_hold_is_refused_without_tokenizing(engine, monkeypatch):
    """No text longer than the context times the vocabulary's longest token fits: it is
    refused from its length, before the tokenizer spends seconds on it."""
    m = engine.loaded
    calls = []
    monkeypatch.setattr(engine, "template", lambda r: calls.append(r))
    monkeypatch.setattr(engine, "tokenize", lambda t: calls.append(t))
    monkeypatch.setattr(m.tokenizer, "apply_chat_template", lambda *a, **kw: calls.append(a))
    monkeypatch.setattr(m.tokenizer._tokenizer, "encode", lambda *a, **kw: calls.append(a))
    too_long = "x" * (m.context_length * m.max_token_chars + 1)
    tool = {"type": "function", "function": {"name": "f", "description": too_long}}
    for make in (
        lambda: ChatRequest(messages=[{"role": "user", "content": too_long}]),
        lambda: ChatRequest(messages=[{"role": "user", "content": "hi"}], tools=[tool]),
        lambda: PromptRequest(prompt=too_long),
    ):
        with pytest.raises(RequestError) as info:
            engine.submit(make())
        assert info.value.status == 413 and info.value.code == "context_length_exceeded"
        assert f"maximum context length is {m.context_length} tokens" in info.value.message
    assert not calls and engine.stats().inflight == 0


@pytest.mark.parametrize("field", ["json_schema", "lark"])
def test_a_grammar_over_the_size_limit_is_refused_before_compiling(engine, monkeypatch, field):
    import radixchat.core.engine.sample.constrain as constrain

    compiled = []
    monkeypatch.setattr(constrain, "grammar_for", lambda s: compiled.append(s))
    monkeypatch.setattr(constrain, "grammar_of_lark", lambda s: compiled.append(s))
    limit = engine.settings.max_schema_bytes
    big = {
        "json_schema": {
            "type": "object",
            "properties": {f"p{i}": {"type": "string", "description": "d" * 100} for i in range(limit // 100)},
        },
        "lark": 'start: "' + "a" * limit + '"',
    }[field]
    with pytest.raises(RequestError) as info:
        asyncio.run(engine.asubmit(chat("lists", **{field: big})))
    assert info.value.status == 400 and info.value.code == "schema_too_large"
    assert f"limit of {limit:,} bytes" in info.value.message and not compiled
    assert engine.stats().inflight == 0


def test_engine_checked_offset_semantics_at_start(engine):
    assert engine.offset_report == {"BatchKVCache": "ok", "BatchRotatingKVCache": "ok"}


def test_usage_and_timings_are_reported(engine):
    req = ChatRequest(
        messages=[{"role": "user", "content": "a question never asked before"}], sampling={"max_tokens": 10}
    )
    final = run_alone(engine, req)
    u = final.usage
    assert final.finish_reason == "length"
    assert u.generated_tokens == 10 and u.prompt_tokens > 5 and u.cached_tokens == 0
    assert u.ttft_ms is not None and 0 < u.ttft_ms <= u.total_ms
    assert u.queue_ms >= 0 and u.decode_tps > 0
    again = run_alone(engine, req)
    assert again.usage.cached_tokens == u.prompt_tokens - 1  # all but the last prompt token
    assert again.text == final.text


def test_deltas_add_up_to_final_text(engine):
    events = list(engine.submit(chat("sets", max_tokens=16)))
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert isinstance(events[-1], Finished)
    assert len(deltas) >= 2 and "".join(deltas) == events[-1].text


def test_stop_string_ends_request(engine):
    full = run_alone(engine, chat("tuples", max_tokens=20)).text
    stop = full[5:8]
    assert stop.strip(), "need a non-blank stop string from the reply"
    final = run_alone(engine, chat("tuples", max_tokens=20, stop=["never in it", stop]))
    assert final.finish_reason == "stop" and final.stop_sequence == stop  # which one ended it
    assert final.text == full[: full.index(stop)]
    assert run_alone(engine, chat("tuples", max_tokens=20)).stop_sequence is None


def test_cancel_mid_generation_frees_the_slot(engine):
    handle = engine.submit(chat("classes", max_tokens=400))
    seen = 0
    for ev in handle:
        if isinstance(ev, TextDelta):
            seen += 1
            if seen == 3:
                steps_at_cancel = engine.steps
                handle.cancel()
        else:
            final = ev
            break
    assert isinstance(final, Finished) and final.finish_reason == "cancelled"
    assert final.usage.generated_tokens < 400
    assert engine.steps - steps_at_cancel <= 5, "cancel should land within a few steps"
    assert engine.stats().inflight == 0 and engine.stats().inflight == 0
    assert run_alone(engine, chat("modules", max_tokens=5)).usage.generated_tokens == 5


@pytest.mark.parametrize(
    "make, status, words",
    [
        (lambda: ChatRequest(messages=[]), None, "at least 1"),
        (lambda: ChatRequest(messages=[{"role": "robot", "content": "hi"}]), None, "role"),
        (
            lambda: ChatRequest(messages=[{"role": "user", "content": "hi"}], sampling={"max_tokens": 0}),
            None,
            "greater than 0",
        ),
        (
            lambda: ChatRequest(messages=[{"role": "user", "content": "hi"}], sampling={"max_tokens": -5}),
            None,
            "greater than 0",
        ),
        (
            lambda: ChatRequest(messages=[{"role": "user", "content": "hi"}], sampling={"temperature": -1}),
            None,
            "temperature",
        ),
        (lambda: ChatRequest(messages=[{"role": "user", "content": "hi"}], sampling={"stop": [""]}), None, "stop"),
        (lambda: ChatRequest(messages=[{"role": "user", "content": "lists " * 2000}]), 413, "context"),
        (lambda: ChatRequest(messages=[{"role": "user", "content": "hi"}], sampling={"seed": 2**64}), None, "seed"),
        (
            lambda: ChatRequest(messages=[{"role": "user", "content": "hi"}], sampling={"seed": -(2**63) - 1}),
            None,
            "seed",
        ),
        (
            lambda: ChatRequest(messages=[{"role": "user", "content": "hi"}], sampling={"top_k": 10**6}),
            400,
            "vocabulary",
        ),
        (
            lambda: ChatRequest(messages=[{"role": "user", "content": "hi"}], sampling={"top_p": float("nan")}),
            None,
            "top_p",
        ),
        (
            lambda: ChatRequest(messages=[{"role": "user", "content": "hi"}], sampling={"stop": ["x" * 1001]}),
            None,
            "stop",
        ),
    ],
)
def test_bad_requests_are_refused_and_engine_goes_on(engine, make, status, words):
    with pytest.raises((RequestError, ValueError)) as info:
        engine.submit(make())
    assert words in str(info.value)
    if status is not None:
        assert isinstance(info.value, RequestError) and info.value.status == status
    assert engine.stats().inflight == 0
    assert run_alone(engine, chat("lists", max_tokens=4)).usage.generated_tokens == 4


def test_failing_request_fails_alone(engine, monkeypatch):
    import radixchat.core.engine.sample.sampling as sampling_mod

    real = sampling_mod.make_request_sampler

    def faulty(s, constraint=None):
        if s.seed == 666:

            def boom(logprobs):
                raise RuntimeError("sampler exploded")

            return boom
        return real(s, constraint)

    monkeypatch.setattr(sampling_mod, "make_request_sampler", faulty)
    expected = [run_alone(engine, chat(w, max_tokens=12)).text for w in WORDS[:3]]
    handles = [engine.submit(chat(w, max_tokens=12)) for w in WORDS[:3]]
    bad = engine.submit(chat("sets", max_tokens=12, temperature=1.0, seed=666))
    results = [h.result() for h in handles]
    failed = bad.result()
    assert isinstance(failed, Failed) and failed.message == INTERNAL_ERROR  # no library text
    assert [r.text for r in results] == expected


def test_a_sampler_that_cannot_be_built_fails_only_its_request(engine, monkeypatch):
    """The sampler is made when the batch admits its requests: one that raises there (as
    mx.random.key did for a negative seed) must leave the others admitted with it alone."""
    import radixchat.core.engine.sample.sampling as sampling_mod

    real = sampling_mod.make_request_sampler

    def faulty(s, constraint=None):
        if s.seed == 667:
            raise TypeError("key(): incompatible function arguments")
        return real(s, constraint)

    monkeypatch.setattr(sampling_mod, "make_request_sampler", faulty)
    expected = [run_alone(engine, chat(w, max_tokens=10)).text for w in WORDS[:4]]
    # queued together, so one admission takes them all
    handles = [engine.submit(chat(w, max_tokens=10)) for w in WORDS[:2]]
    bad = engine.submit(chat("sets", max_tokens=10, temperature=1.0, seed=667))
    handles += [engine.submit(chat(w, max_tokens=10)) for w in WORDS[2:4]]
    assert [h.result().text for h in handles] == expected
    failed = bad.result()
    assert isinstance(failed, Failed) and failed.message == INTERNAL_ERROR
    assert engine.stats().inflight == 0


def test_batch_step_failure_fails_running_requests_then_recovers(engine, monkeypatch):
    gen_cls = type(engine._gen)
    real_next = gen_cls.next
    calls = {"n": 0}

    def flaky(self):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated MLX failure")
        return real_next(self)

    monkeypatch.setattr(gen_cls, "next", flaky)
    final = engine.submit(chat("lists", max_tokens=50)).result()
    assert isinstance(final, Failed) and final.message == INTERNAL_ERROR
    assert engine.alive
    assert run_alone(engine, chat("lists", max_tokens=6)).usage.generated_tokens == 6


@pytest.mark.parametrize("seed", [-5, -(2**63), 2**63, 2**64 - 1])
def test_signed_and_unsigned_64_bit_seeds_sample_alongside_others(engine, seed):
    """A negative or huge seed once ended every request of the batch it joined."""
    others = [engine.submit(chat(w, max_tokens=8)) for w in WORDS[:3]]
    odd = engine.submit(chat("sets", max_tokens=8, temperature=1.0, seed=seed))
    assert all(isinstance(h.result(), Finished) for h in others + [odd])
    again = run_alone(engine, chat("sets", max_tokens=8, temperature=1.0, seed=seed))
    assert again.text == odd.result().text


def test_seed_gives_same_sample_alone_and_batched(engine):
    req = lambda: chat("generators", max_tokens=16, temperature=1.0, seed=1234)  # noqa: E731
    alone = run_alone(engine, req()).text
    others = [engine.submit(chat(w, max_tokens=16, temperature=1.0)) for w in WORDS[:4]]
    batched = engine.submit(req())
    assert batched.result().text == alone
    for h in others:
        h.result()


def test_asyncio_callers_stream_and_cancel(engine):
    async def main():
        texts = []
        for w in WORDS[:2]:
            h = engine.submit(chat(w, max_tokens=8))
            async for ev in h:  # noqa: B007
                pass
            texts.append(ev.text)
        h = engine.submit(chat("dicts", max_tokens=300))
        async for ev in h:
            if isinstance(ev, TextDelta):
                h.cancel()
        return texts, ev

    texts, last = asyncio.run(main())
    assert texts == [run_alone(engine, chat(w, max_tokens=8)).text for w in WORDS[:2]]
    assert isinstance(last, Finished) and last.finish_reason == "cancelled"


def test_a_caller_that_fell_behind_gets_the_text_so_far_in_one_delta(engine):
    async def main():
        h = engine.submit(chat("lists", max_tokens=24))
        while h.final is None:  # a client busy elsewhere while the reply is written
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # the engine's last flush reaches this loop
        return [ev async for ev in h.batched()]

    events = asyncio.run(main())
    final = events[-1]
    assert isinstance(final, Finished) and final.usage.generated_tokens > 2
    assert len(events) == 2 and events[0].text == final.text


def test_batched_deltas_add_up_to_the_final_text_as_they_come(engine):
    async def main():
        h = engine.submit(chat("sets", max_tokens=40))
        return [ev async for ev in h.batched()]

    events = asyncio.run(main())
    assert all(isinstance(e, TextDelta) for e in events[:-1]) and isinstance(events[-1], Finished)
    assert "".join(e.text for e in events[:-1]) == events[-1].text != ""


def test_failure_while_finishing_releases_the_slot_once(engine, monkeypatch):
    from radixchat.core.engine.textstream import TextStream

    def broken_finish(self):
        raise RuntimeError("detokenizer broke at the end")

    monkeypatch.setattr(TextStream, "finish", broken_finish)
    final = engine.submit(chat("sets", max_tokens=5)).result()
    assert isinstance(final, Failed) and final.message == INTERNAL_ERROR
    assert engine.stats().inflight == 0 and engine.stats().inflight == 0
    monkeypatch.undo()
    assert run_alone(engine, chat("sets", max_tokens=5)).usage.generated_tokens == 5


def test_text_is_made_beside_the_next_step_unless_the_engine_must_see_it(engine, monkeypatch):
    """Detokenizing runs in the engine's output thread, off the engine thread's path between
    two steps; a request with stop strings keeps its text on the engine thread, which ends
    it at the step that wrote the stop string. Either way the reply is the same."""
    from radixchat.core.engine.textstream import TextStream

    seen = []
    real = TextStream.add

    def add(self, token):
        seen.append(threading.current_thread().name)
        return real(self, token)

    monkeypatch.setattr(TextStream, "add", add)
    plain = run_alone(engine, chat("modules", max_tokens=6))
    assert plain.text and set(seen) == {"radixchat-output"}
    seen.clear()
    watched = run_alone(engine, chat("modules", max_tokens=6, stop=["never written"]))
    assert set(seen) == {"radixchat-engine"}
    assert watched.text == plain.text and watched.usage.generated_tokens == plain.usage.generated_tokens


def test_text_that_fails_in_the_output_thread_fails_its_request_and_stops_its_steps(engine, monkeypatch):
    from radixchat.core.engine.textstream import TextStream

    def broken_add(self, token):
        raise RuntimeError("detokenizer broke")

    monkeypatch.setattr(TextStream, "add", broken_add)
    before = engine.steps
    final = engine.submit(chat("classes", max_tokens=200, ignore_eos=True)).result()
    assert isinstance(final, Failed) and final.message == INTERNAL_ERROR
    deadline = time.monotonic() + 10
    while engine.stats().inflight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.stats().inflight == 0
    assert engine.steps - before < 50  # cancelled, not run to its 200 tokens
    monkeypatch.undo()
    assert run_alone(engine, chat("classes", max_tokens=5)).usage.generated_tokens == 5


def test_a_stopped_engine_is_freed_with_its_model_and_cache(tiny_model_dir):
    """Benchmarks and tests start many engines in one process: a stopped one must not stay
    reachable (it did, through the atexit registry, until memory ran out)."""
    import gc
    import weakref

    from radixchat.core.config import Settings
    from radixchat.core.engine.engine import Engine

    eng = Engine(Settings(model=str(tiny_model_dir))).start(timeout=120)
    ref = weakref.ref(eng)
    eng.stop()
    del eng
    gc.collect()
    assert ref() is None
