"""Prompt-lookup speculative decoding (core.engine.step.speculate): the drafts, the slot cache's
holes (core.cache.batch.slots) against a cache that never held the rejected tokens, and the same
greedy tokens from the generator and the engine with speculation on and off."""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.generate import StopSequences
from mlx_lm.models.cache import BatchKVCache, KVCache

from radixchat.core.cache.batch.slots import SlotKVCache, swap_order
from radixchat.core.engine.step import speculate
from radixchat.core.engine.step.speculate import Drafts, Speculator
from radixchat.core.engine.step.stepper import BudgetedBatchGenerator

H, D = 2, 4


def test_drafts_follow_the_latest_earlier_occurrence_of_the_last_words():
    d = Drafts()
    d.sync([1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2])
    assert d.propose(3, 3) == [4, 5, 9]  # the 3-gram "1 2 3" first, though "2 3" came later
    d = Drafts()
    d.sync([1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 6, 2])
    assert d.propose(3, 3) == [7, 8, 6]  # no earlier "6 2 3": the latest "2 3"
    assert not d.likely()  # "6 2" is new: the cheap check misses a repeat that starts at the current token
    d = Drafts()
    d.sync([5, 1, 2, 3, 4, 6, 1, 2])
    assert d.likely() and d.propose(3, 2) == [4, 6]
    d.sync([5, 1, 2, 3, 4, 6, 1, 2, 3])  # the row ran its current token
    assert d.propose(4, 4) == [6, 1, 2, 3]
    fresh = Drafts()
    fresh.sync([1, 2, 3, 4])
    assert not fresh.likely() and fresh.propose(5, 3) == []  # nothing repeats
    assert Drafts().propose(7, 2) == []
    one = Drafts()
    one.sync([7])
    assert one.propose(7, 2) == []  # a 1-token match is not enough


def kv(rng: random.Random, b: int, n: int) -> mx.array:
    return mx.array([[[[rng.random() for _ in range(D)] for _ in range(n)] for _ in range(H)] for _ in range(b)])


def attend(cache, q: mx.array, k: mx.array, v: mx.array) -> mx.array:
    n = q.shape[2]
    mask = cache.make_mask(n) if isinstance(cache, SlotKVCache) else "causal" if n > 1 else None
    keys, values = cache.update_and_fetch(k, v)
    return mx.fast.scaled_dot_product_attention(q, keys, values, scale=0.5, mask=mask)


@pytest.mark.parametrize("seed", range(4))
def test_holes_attend_like_caches_that_never_held_the_rejected_tokens(seed):
    """Each row keeps a random part of every multi-token write; a plain per-row KVCache gets
    only what the row kept. Decodes, joins, leaves and compactions in between."""
    rng = random.Random(seed)
    lengths = [rng.randint(1, 12) for _ in range(3)]
    refs = []
    for n in lengths:
        c = KVCache()
        k = kv(rng, 1, n)
        c.update_and_fetch(k, k + 1)
        refs.append(c)
    slot = SlotKVCache.merge(refs)
    refs = [c for c in refs]
    for step in range(40):
        b = len(refs)
        op = rng.random()
        if op < 0.15:  # a prompt joins
            c = KVCache()
            k = kv(rng, 1, rng.randint(1, 20))
            c.update_and_fetch(k, k + 1)
            slot.extend(BatchKVCache.merge([c]))
            fresh = KVCache()
            fresh.update_and_fetch(c.keys[..., : c.offset, :], c.values[..., : c.offset, :])
            refs.append(fresh)
            continue
        if op < 0.25 and b > 1:  # some leave
            keep = sorted(rng.sample(range(b), rng.randint(1, b - 1)))
            order = swap_order(keep)
            slot.filter(order)
            refs = [refs[i] for i in order]
            continue
        if op < 0.3:
            slot.compact()
        width = rng.randint(1, 4)
        k = kv(rng, b, width)
        q = k * 2 - 1
        out = attend(slot, q, k, k + 1)
        kept = [rng.randint(1, width) for _ in range(b)]
        for i, ref in enumerate(refs):
            mine = attend(ref, q[i : i + 1], k[i : i + 1], k[i : i + 1] + 1)
            # query j sees the row's whole write up to j, rejected drafts included, as a verify does
            assert mx.allclose(out[i : i + 1], mine, atol=1e-5).item(), (step, i)
            ref.trim(width - kept[i])
        slot.reject([width - n for n in kept])
        assert slot.offset.tolist() == [r.offset for r in refs]
        for i, ref in enumerate(refs):
            got = slot.extract(i)
            assert got.offset == ref.offset
            assert mx.array_equal(got.keys, ref.keys[..., : ref.offset, :]).item(), (step, i)
            assert mx.array_equal(got.values, ref.values[..., : ref.offset, :]).item(), (step, i)


def test_compaction_drops_the_holes_and_keeps_what_rows_attend_to():
    rng = random.Random(7)
    refs = []
    for n in (5, 9):
        c = KVCache()
        k = kv(rng, 1, n)
        c.update_and_fetch(k, k)
        refs.append(c)
    slot = SlotKVCache.merge(refs)
    k = kv(rng, 2, 3)
    slot.update_and_fetch(k, k)
    slot.reject([2, 0])
    assert slot.most_holes == 2 and slot._idx == 12
    before = [slot.extract(i).keys for i in range(2)]
    q = kv(rng, 2, 1)
    k = kv(rng, 2, 1)
    mask = slot.make_mask(1)
    keys, values = slot.update_and_fetch(k, k)
    expect = mx.fast.scaled_dot_product_attention(q, keys, values, scale=0.5, mask=mask)
    slot.trim(1)  # compacts first
    assert slot.most_holes == 0 and slot._idx == 12  # row 1: 13 columns, less the one trimmed
    assert [slot.extract(i).keys.shape[2] for i in range(2)] == [6, 12]
    for i in range(2):
        assert mx.array_equal(slot.extract(i).keys, before[i]).item()
    mask = slot.make_mask(1)
    keys, values = slot.update_and_fetch(k, k)
    again = mx.fast.scaled_dot_product_attention(q, keys, values, scale=0.5, mask=mask)
    assert mx.allclose(expect, again, atol=1e-6).item()


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return load(str(tiny_model_dir))[0]


def run(model, speculate: int, plan) -> tuple[dict[int, list[int]], BudgetedBatchGenerator]:
    """Greedy tokens per request for a plan of (step, prompt, max_tokens, stop) arrivals."""
    gen = BudgetedBatchGenerator(
        model,
        step_tokens=64,
        on_prompt=lambda r: None,
        speculate=speculate,
        max_tokens=100,
        completion_batch_size=6,
        prefill_batch_size=2,
        prefill_step_size=64,
    )
    out, names, finals, pending = {}, {}, {}, list(plan)
    for step in range(600):
        while pending and pending[0][0] <= step:
            _, prompt, n, stop = pending.pop(0)
            uid = gen.insert([prompt], max_tokens=[n], stop_sequences=[StopSequences([[stop]] if stop else [])])[0]
            names[uid] = len(names)
        for r in gen.next()[1]:
            out.setdefault(names[r.uid], []).append(r.token)
            if r.finish_reason is not None:
                c = r.prompt_cache[0]
                finals[names[r.uid]] = (r.finish_reason, len(r.all_tokens), c.offset, c.keys.shape[2])
        if (
            not pending
            and len(finals) == len(plan)
            and not gen._generation_batch.uids
            and not gen._unprocessed_sequences
            and not gen._currently_processing
        ):
            break
    gen.close()
    return {i: (out[i], finals[i]) for i in out}, gen


def test_the_generator_gives_the_same_tokens_and_caches_with_speculation_on_and_off(model, monkeypatch):
    # every draft verified whole (the width the server would pick depends on its timings):
    # rejected tokens, holes and compactions come often
    monkeypatch.setattr(Speculator, "width", lambda self, uids, drafts: max(len(d) for d in drafts))
    monkeypatch.setattr(speculate, "COMPACT_AT", 6)
    compactions = []
    real_compact = SlotKVCache.compact
    monkeypatch.setattr(
        SlotKVCache, "compact", lambda self: (compactions.append(self.most_holes), real_compact(self))[1]
    )
    rng = random.Random(5)
    # short vocabularies make a random model's replies (and prompts) repeat: drafts get accepted
    plan = sorted(
        (
            rng.randrange(0, 80),
            [rng.randrange(5, 5 + rng.choice([4, 12, 250])) for _ in range(rng.randint(3, 120))],
            rng.randint(1, 60),
            rng.choice([None, None, rng.randrange(5, 20)]),
        )
        for _ in range(18)
    )
    off, _ = run(model, 0, plan)
    on, gen = run(model, 4, plan)
    assert len(on) == len(plan) and on == off
    spec = gen.speculator.summary()
    # the test means something only if drafts were made, kept and thrown away
    assert spec["accepted"] > 20 and spec["drafted"] > spec["accepted"], spec
    assert max(compactions) >= 6, compactions
    for i, (_tokens, (_reason, n_all, offset, width)) in on.items():
        assert offset == width == n_all, i  # the finished cache holds exactly its tokens


def test_the_engine_replies_the_same_with_speculation_and_counts_it(tiny_model_dir):
    from radixchat.core.config import Settings
    from radixchat.core.engine.engine import Engine
    from radixchat.core.seam.requests import ChatRequest

    def replies(speculate: int):
        eng = Engine(Settings(model=str(tiny_model_dir), max_batch=8, max_tokens=40, speculate=speculate)).start(
            timeout=120
        )
        try:
            words = [
                "alpha beta gamma alpha beta gamma alpha",
                "one two one two one two",
                "x y z",
                "code: a=1; b=2; a=1;",
            ]
            handles = [
                eng.submit(
                    ChatRequest(
                        messages=[{"role": "user", "content": w}], sampling={"temperature": 0.0, "max_tokens": 40}
                    )
                )
                for w in words
            ]
            # a second turn restores the first's cache, which speculation wrote with holes
            first = [h.result() for h in handles]
            second = [
                eng.submit(
                    ChatRequest(
                        messages=[
                            {"role": "user", "content": w},
                            {"role": "assistant", "content": f.text},
                            {"role": "user", "content": "again"},
                        ],
                        sampling={"temperature": 0.0, "max_tokens": 40},
                    )
                ).result()
                for w, f in zip(words, first)
            ]
            from radixchat.webui.api.metrics import Metrics

            scraped = Metrics(eng).render().decode()
            return (
                [f.text for f in first + second],
                [s.usage.cached_tokens for s in second],
                eng.stats().speculation,
                scraped,
            )
        finally:
            eng.stop()

    off, cached_off, none, scraped_off = replies(0)
    on, cached_on, spec, scraped = replies(3)
    assert none is None and "spec_decode" not in scraped_off
    assert on == off and cached_on == cached_off and min(cached_on) > 0
    assert spec.drafted > 0 and spec.max_draft == 3, spec
    line = next(x for x in scraped.splitlines() if x.startswith("radixchat:spec_decode_num_draft_tokens_total"))
    assert float(line.split()[-1]) == spec.drafted


def test_a_step_waits_for_the_current_tokens_only_where_a_verify_step_could_pay(model, monkeypatch):
    spec = Speculator(3)
    rows = list(range(32))
    spec.rows = {uid: Drafts() for uid in rows}  # as candidates() makes them; acceptance the prior's
    likely = [i < 2 for i in rows]  # 2 of 32 rows are in a part that repeats
    for n, cost in zip((1, 2, 3, 4), (1.0, 1.35, 1.81, 2.38)):  # [32, n] forwards as measured here
        spec.timed(32, n, cost)
    assert not spec.promising(rows, likely, 3)  # 2 rows' drafts cannot pay for 32 rows' wider forward
    assert spec.promising(rows, [True] * 32, 3)
    for n, cost in zip((1, 2), (1.0, 1.11)):  # one row: a second token costs 11%
        spec.timed(1, n, cost)
    assert spec.promising([0], [True], 3)

    # where no step is promising, the generator never waits and never verifies, and its
    # tokens stay those of plain decoding
    rng = random.Random(9)
    plan = sorted(
        (rng.randrange(0, 30), [rng.randrange(5, 9) for _ in range(rng.randint(8, 40))], rng.randint(5, 30), None)
        for _ in range(6)
    )
    off, _ = run(model, 0, plan)
    waits = {}
    for answer in (True, False):
        monkeypatch.setattr(Speculator, "promising", lambda self, uids, likely, k: answer)  # noqa: B023
        on, gen = run(model, 3, plan)
        assert on == off
        waits[answer] = gen.speculator.waits
        if not answer:
            assert gen.speculator.steps == 0
    assert waits[True] > 0 and waits[False] == 0, waits
