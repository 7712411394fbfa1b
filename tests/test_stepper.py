"""The budgeted engine step (core.engine.step.stepper): a newcomer's last prompt token runs in the
batch's decode of the step that ends its prefill (no forward of its own), its first token
comes out of the next step, and no step prefills more than its budget leaves beside the decode.

Drives the generator directly on the tiny random model, with mlx-lm's own BatchGenerator
as the reference it must beat; the engine-level transparency lives in test_prefix_cache."""

from __future__ import annotations

import itertools

import pytest
from mlx_lm import load
from mlx_lm.generate import BatchGenerator, StopSequences

from radixchat.core.engine.step.generator import Generator, LibraryGenerator
from radixchat.core.engine.step.stepper import BudgetedBatchGenerator, check_layout


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return load(str(tiny_model_dir))[0]


def make(model, budget: int | None, seen: list | None = None, **extra):
    kw = dict(max_tokens=1000, completion_batch_size=16, prefill_batch_size=4, prefill_step_size=512)
    if budget is None:
        return BatchGenerator(model, **kw)
    return BudgetedBatchGenerator(
        model, step_tokens=budget, on_prompt=(seen.extend if seen is not None else lambda r: None), **kw, **extra
    )


def ids(n: int) -> list[int]:
    """A prompt of `n` token ids, all within the model's vocabulary (400): an id past it
    reads whatever memory lies there, and replies differ from run to run."""
    return [3 + i % 390 for i in range(n)]


def insert(gen, prompt: list[int]) -> int:
    return gen.insert([prompt], max_tokens=[1000], stop_sequences=[StopSequences()])[0]


def decode_until_running(gen, uids: set[int]) -> None:
    for _ in range(50):
        if uids <= {r.uid for r in gen.next()[1]}:
            return
    raise AssertionError("the running requests never decoded")


def calls_to_first_token(gen, prompt: list[int]) -> int:
    uid = insert(gen, prompt)
    for calls in range(1, 60):
        if uid in {r.uid for r in gen.next()[1]}:
            return calls
    raise AssertionError("no first token")


class Counted:
    """The model, counting its forwards."""

    def __init__(self, model):
        self.model, self.forwards = model, 0

    def __call__(self, *args, **kwargs):
        self.forwards += 1
        return self.model(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)


def replies(gen, uids: list[int], first: list = (), calls: int = 40) -> dict[int, tuple[list[int], str | None]]:
    """The tokens and finish of each of `uids`, from the responses `first` and those calls give."""
    got: dict[int, list] = {u: [] for u in uids}
    ends: dict[int, str] = {}
    for responses in itertools.chain([first], (gen.next()[1] for _ in range(calls))):
        for r in responses:
            if r.uid in got:
                got[r.uid].append(r.token)
                if r.finish_reason:
                    ends[r.uid] = r.finish_reason
        if len(ends) == len(uids):
            break
    return {u: (got[u], ends.get(u)) for u in uids}


@pytest.mark.parametrize("budget", [None, 256])
def test_a_newcomers_last_prompt_token_runs_in_the_batchs_decode(model, budget):
    counted = Counted(model)
    gen = make(counted, budget)
    assert budget is None or check_layout(gen)
    running = {insert(gen, [5 + i, 6, 7, 8]) for i in range(4)}
    decode_until_running(gen, running)
    before = counted.forwards
    calls = calls_to_first_token(gen, list(range(10, 40)))
    # mlx-lm's order: a call to prefill, one to start decoding (the last prompt token's own
    # forward), one to read the token; budgeted: prefill and decode in one call, read in the next
    assert calls == (3 if budget is None else 2), calls
    # budgeted: one prefill chunk and two batched decodes; mlx-lm: and the one-token forward
    assert counted.forwards - before == (1 + calls + (budget is None)), counted.forwards - before
    gen.close()


def test_a_newcomers_first_token_is_the_one_its_own_forward_would_give(model):
    """The first tokens with the last prompt token run in the batch are mlx-lm's, including
    a prompt whose last token is a stop token of its own (it must not stop there), a reply of
    one token, and a prompt of one token (no K/V before its last token: its own forward)."""
    stop = StopSequences([[39]])
    got = {}
    for budget in (None, 256):
        gen = make(model, budget)
        running = {insert(gen, [5 + i, 6, 7, 8]) for i in range(3)}
        decode_until_running(gen, running)
        uids = gen.insert(
            [list(range(10, 40)), [9, 8, 7], [11, 12, 13]],
            max_tokens=[6, 1, 5],
            stop_sequences=[stop, StopSequences(), StopSequences()],
        )
        uids += gen.insert([[21]], max_tokens=[4], stop_sequences=[StopSequences()])  # one token: no K/V yet
        got[budget] = list(replies(gen, uids, calls=30).values())
        gen.close()
    assert got[256] == got[None]
    assert [len(t) for t, _ in got[256]] == [6, 1, 5, 4] and got[256][1][1] == "length"


def restored(model, prefix: list[int]) -> list:
    """A cache holding `prefix`'s K/V, as the prefix cache restores one."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    model(mx.array([prefix]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def test_a_prompt_cached_but_for_its_last_token_needs_no_forward_of_its_own(model):
    """A retried or repeated prompt, all of it cached but the last token: that token runs in
    the batch's decode too (it had a one-token forward of its own, a whole forward's graph
    and weights for every such join), and the reply is the one mlx-lm's order gives."""
    prompt = list(range(50, 80))
    replies, forwards = {}, {}
    for budget in (None, 256):
        counted = Counted(model)
        gen = make(counted, budget)
        running = {insert(gen, [5 + i, 6, 7, 8]) for i in range(3)}
        decode_until_running(gen, running)
        before, calls, got = counted.forwards, 0, []
        uid = gen.insert(
            [prompt[-1:]],
            max_tokens=[6],
            caches=[restored(model, prompt[:-1])],
            all_tokens=[prompt[:-1]],
            stop_sequences=[StopSequences()],
        )[0]
        while len(got) < 6 and calls < 30:
            calls += 1
            got += [r.token for r in gen.next()[1] if r.uid == uid]
        replies[budget], forwards[budget] = got, (counted.forwards - before, calls)
        gen.close()
    assert len(replies[256]) == 6 and replies[256] == replies[None]
    made, calls = forwards[256]
    assert made == calls, forwards  # one batched decode a call, none of its own
    assert forwards[None][0] == forwards[None][1] + 1  # mlx-lm's own order: and the one-token forward


def test_prompts_restored_from_the_cache_prefill_without_growing_their_buffers(model, monkeypatch):
    """A batch of prompts merged from the prefix cache is as wide as what it holds: mlx-lm's
    cache grew it in the first chunk by 256 zeroed columns and a copy of each layer's buffer,
    a cost every step of a flood of short cached prompts paid. It gets room for the prompts
    once (`make_room`), for a step alone's decode too, and the replies stay mlx-lm's."""
    from mlx_lm.models.cache import BatchKVCache

    grown = []
    update = BatchKVCache.update_and_fetch

    def watched(self, keys, values):
        before = None if self.keys is None else self.keys.shape[2]
        out = update(self, keys, values)
        if type(self) is BatchKVCache and before is not None and self.keys.shape[2] != before:
            grown.append((before, self.keys.shape[2]))
        return out

    monkeypatch.setattr(BatchKVCache, "update_and_fetch", watched)
    heads = [[40 + i] + ids(8) for i in range(3)]
    tails = [[90 + i] + ids(13) for i in range(3)]

    def run(budget):
        gen = make(model, budget)
        uids = gen.insert(
            tails,
            max_tokens=[5] * 3,
            caches=[restored(model, h) for h in heads],
            all_tokens=heads,
            stop_sequences=[StopSequences()] * 3,
        )
        return gen, uids

    reference, uids = run(None)
    expected = replies(reference, uids)
    reference.close()
    grown.clear()  # mlx-lm's own order grows them: the reference, not the subject
    gen, uids = run(256)
    gen.hurry(uids[:1])  # the first takes a step alone: its first decode in these buffers
    alone, steps_alone = gen._first_alone, []
    monkeypatch.setattr(gen, "_first_alone", lambda *a: steps_alone.append(alone(*a)) or steps_alone[-1])
    got = replies(gen, uids)
    gen.close()
    assert got == expected and all(end == "length" for _, end in got.values()), (got, expected)
    assert any(r is not None for r in steps_alone)
    assert grown == [], grown


def test_a_step_prefills_only_what_the_budget_leaves(model):
    budget, decoding = 64, 4
    seen: list = []
    gen = make(model, budget, seen)
    running = {insert(gen, [5 + i, 6, 7, 8]) for i in range(decoding)}
    decode_until_running(gen, running)
    uid = insert(gen, list(range(3, 303)))  # 300 prompt tokens
    before = gen._counters.prompt_tokens
    steps = 0
    while True:
        _, responses = gen.next()
        steps += 1
        chunk, before = gen._counters.prompt_tokens - before, gen._counters.prompt_tokens
        assert chunk <= budget - decoding, chunk  # never a whole prompt in one step
        # the running streams decode every step, whatever is being prefilled
        assert running <= {r.uid for r in responses}
        if uid in {r.uid for r in responses}:
            break
    # ceil: the last token runs in the decode of the step that ends the prefill, the first
    # generated one comes out of the next
    assert steps == -(-299 // (budget - decoding)) + 1
    ends = [r for r in seen if r.uid == uid and r.end_of_prompt]
    assert len(ends) == 1 and ends[0].progress == (299, 300)
    gen.close()


def test_prefill_keeps_a_share_when_the_batch_is_larger_than_the_budget(model):
    budget = 8
    gen = make(model, budget)
    running = {insert(gen, [5 + i, 6, 7, 8]) for i in range(12)}
    decode_until_running(gen, running)
    calls = calls_to_first_token(gen, list(range(3, 43)))  # 40 tokens, 2 per step at least
    assert calls == -(-39 // (budget // 4)) + 1
    gen.close()


def test_the_engine_keeps_mlx_lms_order_when_the_generator_is_not_the_one_it_knows(tiny_model_dir, monkeypatch, caplog):
    """Another mlx-lm whose BatchGenerator lacks the parts the budgeted step reorders: the
    engine says so and serves with the library's own order instead of failing every step."""
    import radixchat.core.engine.step.stepper as stepper
    from radixchat.core.config import Settings
    from radixchat.core.engine.engine import Engine
    from radixchat.core.seam.requests import Finished, Sampling

    monkeypatch.setattr(stepper, "check_layout", lambda gen: False)
    eng = Engine(Settings(model=str(tiny_model_dir), max_batch=4, max_prefill_batch=2, max_tokens=4)).start(timeout=120)
    try:
        assert type(eng._gen) is LibraryGenerator and isinstance(eng._gen, BatchGenerator)
        final = eng.submit_tokens([5, 6, 7, 8], Sampling(max_tokens=3, ignore_eos=True)).result()
        assert isinstance(final, Finished) and final.usage.generated_tokens == 3
    finally:
        eng.stop()
    assert "its own order" in caplog.text


@pytest.mark.parametrize("step_tokens", [0, 256])
def test_every_generator_the_engine_builds_answers_one_interface(model, step_tokens):
    """The budgeted generator and mlx-lm's own (--step-tokens 0) have the same parts, so the
    engine calls them without probing which one it has; the library's extras are idle."""
    from tests.support.step_count import engine

    gen = engine(model, 4, step_tokens=step_tokens)
    try:
        assert isinstance(gen, Generator)
        assert isinstance(gen, BudgetedBatchGenerator) == bool(step_tokens)
        if not step_tokens:
            assert gen.speculator is None and gen.batch_sampler is None
            gen.hurry([0], alone=[0])  # its own prefill order: nothing to hurry
        (uid,) = gen.insert_segments([[[5, 6, 7, 8]]], max_tokens=[2])
        gen.hurry([uid], alone=[uid])
        outs = [r for _ in range(6) for r in gen.next()[1] if r.uid == uid]
        assert [r.finish_reason for r in outs][-1] == "length"
    finally:
        gen.close()


def test_short_prompts_join_the_prefill_together_and_long_ones_a_few_at_a_time(model):
    """The prefill's working size follows the step's room: twenty 8-token prompts all start in
    one step, while 200-token prompts join four at a time (an equal chunk of 256 tokens each
    step, never under MIN_CHUNK), so the first of them is not held back by all the others."""
    from radixchat.core.engine.step.stepper import MIN_CHUNK

    def gen_for():
        return BudgetedBatchGenerator(
            model,
            step_tokens=256,
            on_prompt=lambda r: None,
            max_tokens=1000,
            completion_batch_size=64,
            prefill_batch_size=32,
            prefill_step_size=512,
        )

    gen = gen_for()
    short = {insert(gen, [5 + i, 6, 7, 8, 9, 10, 11, 12]) for i in range(20)}
    gen.next()
    assert not gen._unprocessed_sequences and not gen._currently_processing  # all prefilled at once
    assert short <= {r.uid for r in gen.next()[1]}
    gen.close()

    gen = gen_for()
    long = [insert(gen, list(range(3 + i, 203 + i))) for i in range(8)]
    most, first_at = 0, None
    for step in range(1, 40):
        _, responses = gen.next()
        most = max(most, len(gen._currently_processing))
        if first_at is None and long[0] in {r.uid for r in responses}:
            first_at = step
    assert most == 256 // MIN_CHUNK == 4
    assert first_at == -(-199 // (256 // 4)) + 1  # 64 tokens a step, then its first token
    gen.close()


def test_prompts_that_start_decoding_together_move_without_a_copy_of_their_kv(model, monkeypatch):
    """When every prompt in prefill reaches its last token in the same step (a round of short
    follow-ups), the prompt batch moves to the decoding batch whole: mlx-lm's split would first
    deep-copy every layer's K/V of all of them. Their tokens stay the library's (above)."""
    from mlx_lm.generate import PromptProcessingBatch

    copies = []
    copy = PromptProcessingBatch._copy
    monkeypatch.setattr(PromptProcessingBatch, "_copy", lambda self: copies.append(len(self)) or copy(self))
    gen = make(model, 256)
    uids = gen.insert([[5, 6, 7, 8], [9, 10, 11, 12]], max_tokens=[3, 3], stop_sequences=[StopSequences()] * 2)
    decode_until_running(gen, set(uids))
    assert copies == []
    uid = insert(gen, [13, 14, 15, 16])  # one joins alone: nothing else in prefill either
    decode_until_running(gen, {uid})
    assert copies == []
    gen.close()


class Rows(Counted):
    """The model, noting how many rows each forward runs."""

    def __init__(self, model):
        super().__init__(model)
        self.rows: list[int] = []

    def __call__(self, inputs, *args, **kwargs):
        self.rows.append(inputs.shape[0])
        return super().__call__(inputs, *args, **kwargs)


def test_a_hurried_newcomers_first_token_comes_out_of_a_step_without_the_batch(model):
    """An owner's first prompt (hurried by the engine) while others decode: the call that
    prefills it returns its first token, and every forward in that call runs its row alone,
    none the decoding batch's eight; the batch goes on at the next call, the newcomer in it."""
    counted = Rows(model)
    gen = make(counted, 256)
    running = {insert(gen, [5 + i, 6, 7, 8]) for i in range(8)}
    decode_until_running(gen, running)
    uid = insert(gen, list(range(10, 40)))
    gen.hurry([uid])
    counted.rows.clear()
    _, responses = gen.next()
    assert [r.uid for r in responses] == [uid]
    assert counted.rows and set(counted.rows) == {1}, counted.rows  # its prefill, last token, next token
    _, responses = gen.next()
    assert running | {uid} == {r.uid for r in responses}
    assert max(counted.rows) == 9
    gen.close()


def test_a_newcomer_alone_gets_the_reply_mlx_lms_order_gives_and_the_batch_loses_nothing(model):
    """Greedy replies, a newcomer's and the running rows', equal to mlx-lm's own generator's:
    a newcomer of several chunks, one whose first token is a stop token, one of one token,
    and rows whose prompt is one token; nothing is returned twice or lost in the join."""
    stop = StopSequences([[39]])
    got = {}
    for budget in (None, 256):
        gen = make(model, budget)
        running = gen.insert([[5 + i, 6, 7, 8] for i in range(3)], max_tokens=[24] * 3)
        decode_until_running(gen, set(running))  # (their first tokens: the same in both)
        uids = gen.insert(
            [list(range(10, 210)), [9, 8, 7], [11, 12, 13], [21]],
            max_tokens=[6, 1, 5, 4],
            stop_sequences=[stop, StopSequences(), StopSequences(), StopSequences()],
        )
        first = []
        if budget is not None:
            gen.hurry(uids)
            first = gen.next()[1]
            assert sorted(r.uid for r in first) == uids  # all four alone, the long one in four chunks
        got[budget] = replies(gen, running + uids, first)
        gen.close()
    assert got[256] == got[None]
    assert [len(got[256][u][0]) for u in uids] == [6, 1, 5, 4]
    assert {len(got[256][u][0]) for u in running} == {23} and got[256][uids[1]][1] == "length"


def test_newcomers_alone_never_take_two_steps_in_a_row(model):
    """A stream of hurried newcomers (one-token requests, each its owner's first) cannot
    stall the decoding batch: an ordinary step, the batch's decode, runs between two steps
    of newcomers alone."""
    gen = make(model, 256)
    running = {insert(gen, [5 + i, 6, 7, 8]) for i in range(4)}
    decode_until_running(gen, running)
    batch_steps = 0
    for i in range(6):
        uid = gen.insert([[30 + i, 31, 32]], max_tokens=[1], stop_sequences=[StopSequences()])[0]
        gen.hurry([uid])
        for _ in range(2):
            batch_steps += bool(running & {r.uid for r in gen.next()[1]})
    assert batch_steps >= 6
    gen.close()


def test_a_newcomer_removed_before_it_joins_the_batch_leaves_its_cache_and_the_others_go_on(model):
    """Cancelled right after its step alone (its rows not yet in the decoding batch): its
    cache and tokens come back whole, and the running rows are untouched."""
    gen = make(model, 256)
    running = {insert(gen, [5 + i, 6, 7, 8]) for i in range(4)}
    decode_until_running(gen, running)
    prompt = list(range(10, 40))
    uid = insert(gen, prompt)
    gen.hurry([uid])
    first = [r.token for r in gen.next()[1] if r.uid == uid]
    cache, tokens = gen.remove([uid], return_prompt_caches=True)[uid]
    assert tokens == prompt + first and cache[0].offset == len(tokens)
    assert running == {r.uid for r in gen.next()[1]} | {r.uid for r in gen.next()[1]}
    gen.close()


def test_a_newcomer_goes_alone_past_a_hurried_prompt_too_long_for_the_step(model):
    """Two owners' first prompts hurried together, a flood's long one first: the short one
    goes alone and returns its first token; the long one stays hurried and is in the next
    step's prefill."""
    gen = make(model, 256)
    running = {insert(gen, [5 + i, 6, 7, 8]) for i in range(4)}
    decode_until_running(gen, running)
    earlier = insert(gen, list(range(100, 160)))
    long, short = insert(gen, ids(400)), insert(gen, list(range(10, 30)))
    gen.hurry([long, short])
    assert [r.uid for r in gen.next()[1]] == [short]
    gen.next()
    assert gen._prompt_batch.uids == [long]  # and the earlier one, shorter, prefilled whole beside it
    assert not gen._unprocessed_sequences and earlier in gen._generation_batch.uids
    gen.close()


@pytest.mark.parametrize("prefill_s", [0.0, 1e-6])
def test_the_shared_prefill_is_cut_to_what_fits_its_time(model, prefill_s):
    """With `prefill_s`, a step's shared prefill is what the latest chunks' cost per token fits
    in that time, never under MIN_CHUNK: here, a limit nothing fits cuts every chunk (the
    running rows' prompts gave the cost) to MIN_CHUNK; without one, the token budget decides."""
    from radixchat.core.engine.step.stepper import MIN_CHUNK

    gen = make(model, 256, prefill_s=prefill_s)
    running = {insert(gen, [5 + i, 6, 7, 8]) for i in range(2)}
    decode_until_running(gen, running)
    insert(gen, ids(800))
    chunks, before = [], gen._counters.prompt_tokens
    for _ in range(3):
        gen.next()
        chunks.append(gen._counters.prompt_tokens - before)
        before = gen._counters.prompt_tokens
    assert chunks == [254 if not prefill_s else MIN_CHUNK] * 3, chunks
    gen.close()


def test_a_newcomer_waiting_ends_the_shared_prefill_after_a_piece(model):
    """A chunk of a flood's long prompts ran as one forward, and a newcomer's first prompt
    waited for all of it. Now, where the engine asks for it (`newcomer`), the chunk runs in
    pieces of about PIECE_S (here MIN_CHUNK at first: a token is made to cost 1 ms), and a newcomer
    waiting ends it after the piece in flight; the reply is the one the whole chunk gives."""
    from radixchat.core.engine.step.stepper import MIN_CHUNK

    def run(pieces: bool, waiting_at: set[int]):
        gen = make(model, 256, prefill_s=10.0)
        calls = itertools.count()
        step = [0]
        if pieces:
            gen.newcomer = lambda: (next(calls), step[0] in waiting_at)[1]
        running = {insert(gen, [5 + i, 6, 7, 8]) for i in range(2)}
        decode_until_running(gen, running)
        long = insert(gen, ids(800))
        chunks, before = [], gen._counters.prompt_tokens
        for step[0] in range(4):
            gen._token_s = 1e-3  # a millisecond a token: the first piece is MIN_CHUNK (PIECE_S 0.05)
            gen.next()
            chunks.append(gen._counters.prompt_tokens - before)
            before = gen._counters.prompt_tokens
        out = replies(gen, [long], calls=40)[long][0][:8]
        gen.close()
        return chunks, out

    whole, reply = run(False, set())
    assert whole[:3] == [254] * 3  # (one forward a step: the token budget decides)
    pieced, pieced_reply = run(True, set())
    assert pieced == whole  # nobody waiting: every piece of the room runs
    cut, cut_reply = run(True, {1, 2})
    assert cut[0] == 254 and cut[1:3] == [MIN_CHUNK, MIN_CHUNK] and cut[3] == 254, cut
    assert pieced_reply == reply == cut_reply and len(reply) == 8
