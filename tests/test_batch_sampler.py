"""The decoding batch samples in one call: each row keeps its own parameters and seed."""

from __future__ import annotations

import threading

import mlx.core as mx
import pytest

from radixchat.core.engine.sample import batch_sampler
from radixchat.core.engine.sample.batch_sampler import BatchSampler, Draw, draw
from radixchat.core.seam.requests import ChatRequest, Finished

WORDS = ["lists", "tuples", "dicts", "sets", "generators", "classes"]
# six requests that differ in every sampling parameter the batch draws in one go
MIXED = [
    dict(temperature=0.7, seed=11),
    dict(temperature=1.3, top_p=0.9, seed=12),
    dict(temperature=1.0, top_k=5, seed=13),
    dict(temperature=0.9, min_p=0.1, seed=14),
    dict(temperature=1.0, logit_bias={5: 3.0}, seed=15),
    dict(),  # greedy
]


def chat(word: str, **sampling) -> ChatRequest:
    # a system prompt of its own: the engine is shared with other modules' tests, whose
    # cached prefixes these must neither find nor leave behind for them
    messages = [{"role": "system", "content": "Sample me."}, {"role": "user", "content": f"Say {word}"}]
    return ChatRequest(messages=messages, sampling=sampling)


def together(engine, reqs: list[ChatRequest]) -> list[Finished]:
    out: dict[int, Finished] = {}
    barrier = threading.Barrier(len(reqs))

    def one(i):
        barrier.wait()
        out[i] = engine.submit(reqs[i]).result()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(isinstance(out.get(i), Finished) for i in range(len(reqs))), out
    return [out[i] for i in range(len(reqs))]


def test_one_categorical_draw_a_step_for_all_sampled_rows(engine, monkeypatch):
    """Row by row, a batch of 6 sampled requests drew 6 times a step; now once."""
    calls = []
    real = mx.random.categorical

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(mx.random, "categorical", counted)
    steps = engine.steps
    done = together(engine, [chat(w, max_tokens=16, temperature=0.8, top_p=0.95) for w in WORDS])
    steps = engine.steps - steps
    tokens = sum(f.usage.generated_tokens for f in done)
    assert tokens >= 2 * steps  # the rows really shared steps
    assert len(calls) <= steps, (len(calls), steps, tokens)


def test_each_row_of_a_mixed_batch_samples_as_it_does_alone(engine):
    alone = [engine.submit(chat(w, max_tokens=12, **s)).result().text for w, s in zip(WORDS, MIXED)]
    batched = together(engine, [chat(w, max_tokens=12, **s) for w, s in zip(WORDS, MIXED)])
    assert [f.text for f in batched] == alone
    assert len(set(alone)) > 1


def test_the_vmapped_draw_is_each_rows_own_draw():
    logits = mx.random.normal((5, 300), key=mx.random.key(0))
    rows = [Draw(0.5 + 0.2 * i, 1.0, 0, 0.0, seed=100 + i) for i in range(5)]
    keys = [mx.array(Draw(0.5 + 0.2 * i, 1.0, 0, 0.0, seed=100 + i).key(), dtype=mx.uint32) for i in range(5)]
    one_by_one = [mx.random.categorical(logits[i] * rows[i].inv_temp, key=keys[i]).item() for i in range(5)]
    assert draw(logits, rows).tolist() == one_by_one


def test_rewind_draws_the_same_tokens_again():
    logits = mx.random.normal((1, 300), key=mx.random.key(1))
    d = Draw(1.0, 1.0, 0, 0.0, seed=7)
    first = [d(logits).item() for _ in range(6)]
    d.rewind(2)
    assert [d(logits).item() for _ in range(4)] == first[2:]
    assert len(set(first)) > 1  # a hot draw over 300 tokens varies


def test_a_batch_of_another_size_than_its_rows_is_refused():
    s = BatchSampler()
    s.rows = lambda: ([1, 2], [[], []], mx.zeros((2,), mx.uint32))
    with pytest.raises(RuntimeError, match="2"):
        s(mx.zeros((3, 10)))


def test_unseeded_rows_do_not_share_a_stream():
    logits = mx.zeros((8, 1000))  # flat: every token as likely
    rows = [Draw(1.0, 1.0, 0, 0.0, seed=None) for _ in range(8)]
    assert len(set(draw(logits, rows).tolist())) > 4
    assert batch_sampler._mix(0, 0) != batch_sampler._mix(0, 1)


@pytest.mark.parametrize("seed", range(3))
def test_batched_penalties_are_mlx_lms_processors_row_by_row(seed):
    from radixchat.core.engine.sample.batch_sampler import Penalty, penalize
    from radixchat.core.engine.sample.sampling import penalties
    from radixchat.core.seam.requests import Sampling

    rng = __import__("random").Random(seed)
    n, vocab = 6, 50
    logits = mx.random.normal((n, vocab), key=mx.random.key(seed)) * 4
    past = [[rng.randrange(vocab) for _ in range(rng.choice([0, 3, 40, 90]))] for _ in range(n)]
    inputs = mx.array([rng.randrange(vocab) for _ in range(n)], dtype=mx.uint32)
    pens = [
        Penalty(1.3),
        Penalty(1.0, 0.7),
        Penalty(1.0, 0.0, 0.4),
        Penalty(1.1, 0.5, 0.25),
        Penalty(),  # a row without penalties in a penalized batch
        Penalty(0.8, 0.0, 1.0),
    ]
    got = penalize(logits, pens, past, inputs)
    for i, p in enumerate(pens):
        row = logits[i : i + 1]
        context = mx.array(past[i] + [inputs[i].item()])
        # the processors a request with these penalties gets on the library's path
        s = Sampling(repetition_penalty=p.repetition, presence_penalty=p.presence, frequency_penalty=p.frequency)
        for proc in penalties(s):
            row = proc(context, row)
        assert mx.array_equal(got[i], row[0]).item(), i


def test_penalized_rows_are_not_processed_row_by_row_and_reply_as_through_the_library(engine, monkeypatch):
    """Penalties ran as mlx-lm's processors, one row at a time; the batch sampler applies
    them to every row at once, with the same replies (a request that asks for logprobs
    still goes through the library's processors)."""
    from radixchat.core.engine.sample import sampling

    calls = []
    real = sampling.make_logits_processors

    def counted(**kwargs):
        def wrap(p):
            return lambda tokens, logits: calls.append(1) or p(tokens, logits)

        return [wrap(p) for p in real(**kwargs)]

    monkeypatch.setattr(sampling, "make_logits_processors", counted)
    pens = [
        dict(repetition_penalty=1.3),
        dict(presence_penalty=1.5),
        dict(frequency_penalty=1.2),
        dict(repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.5),
        dict(),
        dict(repetition_penalty=1.5, temperature=0.9, seed=3),
    ]
    batched = together(engine, [chat(w, max_tokens=16, **p) for w, p in zip(WORDS, pens)])
    assert calls == []
    library = together(engine, [chat(w, max_tokens=16, logprobs=0, **p) for w, p in zip(WORDS, pens)])
    assert len(calls) > 16
    assert [f.text for f in batched] == [f.text for f in library]
    plain = engine.submit(chat(WORDS[0], max_tokens=16)).result()
    assert plain.text != batched[0].text or plain.text != batched[3].text  # the penalties did something


SCHEMA = {"type": "object", "properties": {"word": {"type": "string"}, "n": {"type": "integer"}}, "required": ["word"]}


def test_a_steps_grammar_rows_are_masked_together_one_call_an_owner_and_reply_as_alone(engine, monkeypatch):
    """Each grammar row was masked by its own call on the engine thread, one after another;
    now a step masks one owner's rows in one call (llguidance's threads, the GIL released),
    and every row still replies as it does alone: greedy, seeded, beside free rows."""
    calls: list[int] = []
    real = batch_sampler.masks

    def counted(rows, vocab):
        calls.append(len(rows))
        return real(rows, vocab)

    monkeypatch.setattr(batch_sampler, "masks", counted)

    def req(i: int) -> ChatRequest:
        grammar = dict(json_schema=SCHEMA) if i < 4 else {}
        r = chat(WORDS[i], max_tokens=16, **grammar, **(dict(temperature=0.9, seed=30 + i) if i % 2 else {}))
        return r.model_copy(update={"owner": f"grammar-{i % 2}"})

    alone = [engine.submit(req(i)).result() for i in range(6)]
    calls.clear()
    batched = together(engine, [req(i) for i in range(6)])
    assert [f.text for f in batched] == [f.text for f in alone]
    for f in batched[:4]:  # the grammar held (a random model's string may outlast max_tokens)
        assert f.text.startswith('{"word":"'), f.text
    assert max(calls) >= 2  # rows masked together...
    assert max(calls) <= 2  # ...each owner's apart (two grammar rows each)
