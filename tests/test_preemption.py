"""Preemption (core.engine.sched.preempt): requests are admitted by the K/V they hold, and when the
batch outgrows its room a running request pauses and resumes; its text is the text it would
have had, and a newcomer is not held behind long replies that fill the batch."""

from __future__ import annotations

import threading
import time

import pytest

from radixchat.core.cache.batch.layout import BATCH_SHARE
from radixchat.core.config import Settings
from radixchat.core.engine.engine import Engine
from radixchat.core.engine.sched.preempt import HEADROOM
from radixchat.core.seam.requests import Finished, Sampling, TextDelta
from radixchat.webui.api.metrics import Metrics
from tests.support.metrics import metric_value

PROMPTS = [list(range(5 + i, 25 + i)) for i in range(6)]  # 20 tokens each, all different
REPLY = 40


def tight(model_dir, rows: float, **kw) -> Engine:
    """An engine whose batch has room for about `rows` requests of a prompt and a whole reply."""
    probe = Engine(Settings(model=str(model_dir), cache_bytes=1 << 30)).start(timeout=120)
    bpt = probe.kv_bytes_per_token
    probe.stop()
    budget = int(rows * (20 + REPLY + HEADROOM) * bpt / BATCH_SHARE)
    return Engine(Settings(model=str(model_dir), cache_bytes=budget, max_batch=64, **kw)).start(timeout=120)


@pytest.fixture(scope="module")
def roomy(engine):
    return engine


@pytest.fixture(scope="module")
def two_fit(tiny_model_dir):
    eng = tight(tiny_model_dir, 2.5, max_tokens=REPLY * 4)
    yield eng
    eng.stop()


def texts(eng: Engine, prompts, **sampling) -> list[str]:
    handles = [eng.submit_tokens(p, Sampling(max_tokens=REPLY, ignore_eos=True, **sampling)) for p in prompts]
    finals = [h.result() for h in handles]
    assert all(isinstance(f, Finished) and f.usage.generated_tokens == REPLY for f in finals), finals
    return [f.text for f in finals]


def texts_watched(eng: Engine, prompts, measure=sum) -> tuple[list[str], int]:
    """`texts` of the prompts, and the most `measure` (of the tokens each running row holds)
    came to while they ran."""
    peak, done = [0], threading.Event()

    def watch():
        while not done.is_set():
            held = [len(a.prompt) + a.generated for a in list(eng._by_uid.values())]
            peak[0] = max(peak[0], measure(held))
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        return texts(eng, prompts), peak[0]
    finally:
        done.set()
        watcher.join()


def test_greedy_text_through_preemption_is_the_text_alone(roomy, two_fit):
    alone = [texts(roomy, [p])[0] for p in PROMPTS]
    before = two_fit.stats().preemptions
    together, peak = texts_watched(two_fit, PROMPTS)
    s = two_fit.stats()
    assert s.preemptions > before  # six were admitted by what they held, then outgrew the room
    scraped = Metrics(two_fit).render().decode()
    assert metric_value(scraped, "radixchat:num_preemptions_total") == s.preemptions
    assert metric_value(scraped, "radixchat:num_preempted_tokens_total") == s.preempted_tokens > 0
    # one user, no grammar: every preemption was for the next step's room, and says so
    assert s.preemptions_by == {"room": s.preemptions}
    assert metric_value(scraped, "radixchat:preemptions_by_reason_total", reason="room") == s.preemptions
    assert together == alone
    # what the batch held stayed within its room, but for one step's growth of each row
    assert peak <= s.batch_tokens + len(PROMPTS), (peak, s.batch_tokens)


def test_a_seeded_sample_through_preemption_is_the_sample_alone(roomy, two_fit):
    alone = [texts(roomy, [p], temperature=1.0, seed=7)[0] for p in PROMPTS]
    before = two_fit.stats().preemptions
    assert texts(two_fit, PROMPTS, temperature=1.0, seed=7) == alone
    assert two_fit.stats().preemptions > before


def test_a_preempted_stream_pauses_and_its_deltas_add_up_to_its_text(two_fit):
    handles = [two_fit.submit_tokens(p, Sampling(max_tokens=REPLY, ignore_eos=True)) for p in PROMPTS]
    for h in handles:
        events = list(h)
        final = events[-1]
        assert isinstance(final, Finished) and final.finish_reason == "length"
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == final.text


def test_a_newcomer_is_not_held_behind_long_replies_that_fill_the_batch(tiny_model_dir):
    eng = tight(tiny_model_dir, 3.0, max_tokens=4096)
    try:
        room = eng.stats().batch_tokens
        # mallory: three replies long enough to fill the room many times over
        long = [eng.submit_tokens(p, Sampling(max_tokens=room, ignore_eos=True), owner="mallory") for p in PROMPTS[:3]]
        deadline = time.time() + 60
        while eng.stats().preemptions == 0 and time.time() < deadline:
            time.sleep(0.01)
        assert eng.stats().preemptions > 0  # the batch is full of mallory's
        steps = eng.steps
        alice = eng.submit_tokens(PROMPTS[3], Sampling(max_tokens=4, ignore_eos=True), owner="alice").result()
        assert isinstance(alice, Finished) and alice.usage.generated_tokens == 4
        assert eng.steps - steps <= 12  # she waited a few steps, not for a whole long reply
        by = eng.stats().preemptions_by
        assert set(by) <= {"room", "owed"} and sum(by.values()) == eng.stats().preemptions, by
        for h in long:
            h_final = h.result()
            assert isinstance(h_final, Finished) and h_final.usage.generated_tokens == room
    finally:
        eng.stop()


def test_a_long_row_among_short_ones_pays_for_its_padding(roomy, tiny_model_dir):
    """The decoding batch pads every row to the longest: its room counts that, not only each
    row's own tokens, and greedy text is the same as alone."""
    long = list(range(40, 190))  # 150 tokens beside short rows of 20
    prompts = [long, *PROMPTS[:4]]
    alone = [texts(roomy, [p])[0] for p in prompts]
    eng = tight(tiny_model_dir, 3.0)  # by their own tokens the long one and two short ones fit
    try:
        together, peak = texts_watched(eng, prompts, lambda held: len(held) * max(held, default=0))
        room = eng.stats().batch_tokens
    finally:
        eng.stop()
    assert together == alone
    # every row as long as the longest stayed within the room, but for one step's growth
    assert 0 < peak <= room + len(prompts), (peak, room)


def test_a_preempted_request_cancelled_while_it_waits_ends_with_its_text_so_far(tiny_model_dir):
    eng = tight(tiny_model_dir, 2.0, max_tokens=4096)
    try:
        room = eng.stats().batch_tokens
        handles = [eng.submit_tokens(p, Sampling(max_tokens=room, ignore_eos=True)) for p in PROMPTS[:2]]
        deadline = time.time() + 60
        waiting = None
        while waiting is None and time.time() < deadline:
            waiting = next((a for a in list(eng._active.values()) if a.preempted and a.uid is None), None)
            time.sleep(0.005)
        assert waiting is not None
        eng.cancel(waiting.handle.id)
        final = waiting.handle.result()
        assert isinstance(final, Finished) and final.finish_reason == "cancelled"
        assert final.usage.generated_tokens > 0 and final.text
        for h in handles:
            h.cancel()
    finally:
        eng.stop()


def test_a_grammar_goes_on_where_it_was_through_preemption(roomy, two_fit):
    schema = {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]}

    def run(eng: Engine, prompts) -> list[str]:
        sampling = dict(max_tokens=REPLY, temperature=1.0, seed=3, json_schema=schema)
        finals = [h.result() for h in [eng.submit_tokens(p, Sampling(**sampling)) for p in prompts]]
        assert all(isinstance(f, Finished) for f in finals), finals
        return [f.text for f in finals]

    alone = [run(roomy, [p])[0] for p in PROMPTS]
    before = two_fit.stats().preemptions
    assert run(two_fit, PROMPTS) == alone
    assert two_fit.stats().preemptions > before


def test_a_users_slow_grammar_masks_are_paid_from_their_share_of_a_step(tiny_model_dir, monkeypatch):
    """mallory's grammars take 30 ms a mask (as heavy patterns do on a large vocabulary):
    while alice is at work too, mallory keeps only as many constrained rows as fit her share
    of a step (the others pause, then finish as they would have)."""
    from radixchat.core.engine.sample import constrain
    from radixchat.core.engine.sched.mask_share import MASK_FLOOR_S

    slow = constrain.Constraint._consume

    def consume(self):  # timed with the mask, whether a row is masked alone or with the batch's
        slow(self)
        time.sleep(0.03)

    monkeypatch.setattr(constrain.Constraint, "_consume", consume)
    schema = {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]}
    eng = Engine(Settings(model=str(tiny_model_dir), max_batch=32, max_tokens=64)).start(timeout=120)
    removed, remove = [], eng._gen.remove

    def counted(uids, *args, **kw):
        removed.append(len(uids))
        return remove(uids, *args, **kw)

    eng._gen.remove = counted
    try:
        peak, done = [0], threading.Event()

        def watch():
            while not done.is_set():
                rows = [a for a in list(eng._by_uid.values()) if a.owner == "mallory" and a.prefilled]
                if any(a.owner == "alice" for a in list(eng._by_uid.values())):
                    peak[0] = max(peak[0], len(rows))
                time.sleep(0.001)

        sampling = Sampling(max_tokens=12, json_schema=schema)
        theirs = [eng.submit_tokens(p, sampling, owner="mallory") for p in PROMPTS]
        deadline = time.time() + 30
        while sum(a.prefilled for a in list(eng._by_uid.values())) < 4 and time.time() < deadline:
            time.sleep(0.005)
        watcher = threading.Thread(target=watch)
        watcher.start()
        alice = eng.submit_tokens(PROMPTS[0], Sampling(max_tokens=30, ignore_eos=True), owner="alice").result()
        done.set()
        watcher.join()
        assert isinstance(alice, Finished)
        assert all(isinstance(h.result(), Finished) for h in theirs)
        budget = max(MASK_FLOOR_S, eng._model_step_s / 2)
        assert eng.stats().preemptions_by.get("masks", 0) > 0  # the turns' plans say why
        assert sum(eng.stats().preemptions_by.values()) == eng.stats().preemptions
        assert 1 <= peak[0] <= max(1, int(budget / 0.03)) + 1, (peak[0], budget)
        # the rows over her share left the batch together: one filter of its buffers, not one each
        assert max(removed) >= 3 and len(removed) < eng.stats().preemptions, removed
    finally:
        eng.stop()
