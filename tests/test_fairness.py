"""A fair share of the engine: waiting requests are admitted least-served owner first, and
one owner can hold only so many requests at once, nor compile without pause beside others."""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass

import pytest

from radixchat.core.config import Settings
from radixchat.core.engine import prepare
from radixchat.core.engine.engine import Engine
from radixchat.core.engine.prepare import FairPool
from radixchat.core.engine.sched.fairness import PREFER_AMONG, FairQueue, Wait
from radixchat.core.engine.sched.owners import OwnerCounts
from radixchat.core.seam.requests import ChatRequest, Finished, RequestError


@dataclass
class Req:
    owner: str
    name: str
    done: bool = False


def test_the_least_served_owner_goes_first_and_ties_go_by_arrival():
    q = FairQueue()
    flood = [Req("a", f"a{i}") for i in range(6)]
    for r in flood:
        q.push(r)
    assert [r.name for r in q.pick(2, lambda r, p: False)] == ["a0", "a1"]
    q.charge("a", prompt_tokens=100, generated_tokens=10)
    b = Req("b", "b0")
    q.push(b)  # lifted to a's counter: no credit for having been away
    assert q.served["b"] == q.served["a"] == 120
    q.charge("a", generated_tokens=5)  # a's running requests go on decoding
    assert [r.name for r in q.pick(1, lambda r, p: False)] == ["b0"]
    assert [r.name for r in q.pick(1, lambda r, p: False)] == ["a2"]


def test_within_an_owner_the_longest_cached_prefix_goes_first_but_never_across_owners():
    q = FairQueue()
    cached = {"a0": 0, "a1": 0, "a2": 300, "a3": 300, "b0": 0}
    for name in ("a0", "a1", "a2", "a3"):
        q.push(Req("a", name))
    asked = []

    def prefer(r):
        asked.append(r.name)
        return cached[r.name]

    # a2's prompt is cached: it goes before a0 and a1; ties (a2, a3) go by arrival
    assert [r.name for r in q.pick(1, lambda r, p: False, prefer)] == ["a2"]
    q.charge("a", prompt_tokens=10)
    q.push(Req("b", "b0"))  # b was idle: lifted to a's counter, then a is charged more
    q.charge("a", generated_tokens=5)
    # fairness still chooses the owner: b's uncached request before a's cached one
    assert [r.name for r in q.pick(2, lambda r, p: False, prefer)] == ["b0", "a3"]
    # an owner with one request waiting has nothing to choose: its prefix is not looked up
    assert "b0" not in asked and "a3" in asked
    # without a preference, first come first served within the owner
    assert [r.name for r in q.pick(1, lambda r, p: False)] == ["a0"]


def test_prefer_is_asked_once_per_request_in_a_pick():
    # one owner's 40 requests fill 40 slots: each pick among the first 16 must not walk the
    # prefix tree again for the requests it has already ranked
    q = FairQueue()
    for i in range(40):
        q.push(Req("a", f"a{i}"))
    asked = Counter()

    def prefer(r):
        asked[r.name] += 1
        return int(r.name[1:]) % 3

    assert len(q.pick(40, lambda r, p: False, prefer)) == 40
    assert max(asked.values()) == 1


def reference_pick(waiting: list, served: dict, slots: int, blocked, prefer) -> list:
    """The pick's rule, spelled out with no care for cost: the least served owner (counting
    this pick's own) first, ties by place in the queue; within that owner, the largest
    `prefer` among its first PREFER_AMONG, ties by place; a blocked one stays, and with it
    the rest of its owner's (`Wait.OWNER`) or everyone's (`Wait.ALL`)."""
    left, picked, pending = list(waiting), [], Counter()
    while len(picked) < slots and left:
        best = min(left, key=lambda r: served.get(r.owner, 0.0) + pending[r.owner])
        mine = [r for r in left if r.owner == best.owner][:PREFER_AMONG]
        if prefer is not None:
            best = max(mine, key=prefer)
        left.remove(best)
        verdict = blocked(best, picked)
        if verdict is Wait.ALL:
            break
        if verdict is Wait.OWNER:
            left = [r for r in left if r.owner != best.owner]
        elif not verdict:
            picked.append(best)
            pending[best.owner] += 1.0
    return picked


@pytest.mark.parametrize("seed", range(20))
def test_the_pick_follows_its_rule_on_random_queues(seed):
    rng = random.Random(seed)
    q = FairQueue()
    owners = [f"o{i}" for i in range(rng.randint(1, 12))]
    for i in range(rng.randint(1, 120)):
        q.push(Req(rng.choice(owners), f"r{i}"))
        if rng.random() < 0.3:
            q.charge(rng.choice(owners), prompt_tokens=rng.randint(0, 3), generated_tokens=rng.randint(0, 2))
    if rng.random() < 0.5:  # a preempted request goes back first among its owner's
        q.requeue(Req(rng.choice(owners), "back"))
    rank = {f"r{i}": rng.randint(0, 4) for i in range(120)} | {"back": 2}
    prefer = (lambda r: rank[r.name]) if rng.random() < 0.5 else None
    shut = {name for name in rank if rng.random() < 0.2}
    verdicts = {name: rng.choice([True, True, Wait.OWNER, Wait.ALL]) for name in shut}

    def blocked(r, picked):
        return verdicts.get(r.name) or (len(picked) > 3 and r.owner == owners[0])

    waiting = [r for _, r in q._waiting]
    slots = rng.randint(1, 60)
    expected = reference_pick(waiting, dict(q.served), slots, blocked, prefer)
    got = q.pick(slots, blocked, prefer)
    assert [r.name for r in got] == [r.name for r in expected]
    taken = {id(r) for r in got}
    assert [r.name for _, r in q._waiting] == [r.name for r in waiting if id(r) not in taken]


def test_blocked_requests_wait_and_done_ones_are_dropped():
    q = FairQueue()
    rs = [Req("a", "x"), Req("b", "y"), Req("c", "z")]
    for r in rs:
        q.push(r)
    rs[2].done = True  # cancelled while waiting
    picked = q.pick(3, lambda r, p: r.name == "x")
    assert [r.name for r in picked] == ["y"] and len(q) == 1
    assert [r.name for r in q.pick(3, lambda r, p: False)] == ["x"]


def test_an_idle_owner_banks_no_credit():
    q = FairQueue()
    q.push(Req("a", "a0"))
    q.pick(1, lambda r, p: False)
    q.charge("a", prompt_tokens=1000)
    q.left("a")  # a is idle now
    q.push(Req("b", "b0"))
    q.pick(1, lambda r, p: False)
    q.charge("b", prompt_tokens=5000)
    q.push(Req("a", "a1"))  # a comes back while b is busy: lifted to b's 5000
    assert q.served["a"] == 5000


@pytest.fixture(scope="module")
def small_batch(tiny_model_dir):
    eng = Engine(
        Settings(
            model=str(tiny_model_dir),
            max_batch=2,
            max_prefill_batch=2,
            max_tokens=12,
            max_user_requests=8,
            cache_sharing="user",
        )
    ).start(timeout=120)
    yield eng
    eng.stop()


def req(owner: str, text: str, n: int = 12) -> ChatRequest:
    return ChatRequest(
        messages=[{"role": "user", "content": text}], owner=owner, sampling={"max_tokens": n, "ignore_eos": True}
    )


def test_a_user_behind_a_flood_gets_the_next_free_slot(small_batch):
    """Seven requests of alice queue behind a batch of two; bob's one request, sent last,
    must not wait for all of them (first come first served made it finish last)."""
    finished: list[str] = []
    lock = threading.Lock()

    def run(handle, name):
        final = handle.result()
        assert isinstance(final, Finished)
        with lock:
            finished.append(name)

    handles = [(small_batch.submit(req("alice", f"question {i}", n=24)), f"alice{i}") for i in range(7)]
    time.sleep(0.05)  # alice's first two are running
    handles.append((small_batch.submit(req("bob", "one question")), "bob"))
    threads = [threading.Thread(target=run, args=h) for h in handles]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(finished) == 8
    # bob took the first slot that came free: alice's later requests finished after him
    assert len(finished) - 1 - finished.index("bob") >= 3, finished


def test_one_owner_holds_at_most_max_user_requests(small_batch):
    held = [small_batch.submit(req("carol", f"q{i}", n=40)) for i in range(8)]
    with pytest.raises(RequestError) as info:
        small_batch.submit(req("carol", "one too many"))
    assert info.value.status == 429 and info.value.code == "user_limit"
    other = small_batch.submit(req("dave", "I am someone else", n=2))  # others are not limited
    anonymous = small_batch.submit(req(None, "no owner: the one trusted --no-auth user", n=2))
    for h in held:
        h.cancel()
    for h in held + [other, anonymous]:
        assert isinstance(h.result(), Finished)
    assert isinstance(small_batch.submit(req("carol", "room again", n=2)).result(), Finished)
    assert small_batch.owners["carol"] == 0 and small_batch.stats().inflight == 0


def test_a_newcomer_joins_a_batch_one_user_fills_without_waiting_for_a_slot(small_batch):
    """Replies of one length started together end together: a user arriving while another
    fills the batch would wait a whole reply. Below a fair share, a user joins over the cap."""
    order: list[str] = []
    lock = threading.Lock()

    def run(handle, name):
        assert isinstance(handle.result(), Finished)
        with lock:
            order.append(name)

    flood = [(small_batch.submit(req("erin", f"long {i}", n=60)), f"erin{i}") for i in range(4)]
    deadline = time.time() + 30
    while time.time() < deadline and len(small_batch._by_uid) < 2:
        time.sleep(0.005)
    newcomer = (small_batch.submit(req("frank", "short one", n=2)), "frank")
    threads = [threading.Thread(target=run, args=h) for h in flood + [newcomer]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert order[0] == "frank", order  # before either of erin's running replies ended


@pytest.fixture(scope="module")
def wide_batch(tiny_model_dir):
    """Room for everyone in the batch; two prompts prefill at a time, in small chunks."""
    eng = Engine(
        Settings(
            model=str(tiny_model_dir),
            max_batch=32,
            max_prefill_batch=2,
            step_tokens=32,
            max_tokens=12,
            cache_sharing="user",
        )
    ).start(timeout=120)
    yield eng
    eng.stop()


def test_a_newcomer_is_prefilled_before_a_flood_that_came_first(wide_batch):
    """The batch has room for all of gina's 20 requests, but only two prompts prefill at
    once: hank's one request, sent after hers, must take the next prefill slot instead of
    queueing behind all of her prompts (it did when the engine handed the generator every
    admitted request at once)."""
    eng = wide_batch
    first: dict[str, float] = {}

    def submit(owner: str, name: str, text: str, n: int):
        t = time.perf_counter()
        h = eng.submit(req(owner, text, n=n))
        return name, t, h

    flood = [submit("gina", f"gina{i}", f"flood question number {i}, " * 6, 30) for i in range(20)]
    deadline = time.time() + 30
    while time.time() < deadline and not any(a.prefilled for a in list(eng._by_uid.values())):
        time.sleep(0.001)
    hank = submit("hank", "hank", "one short question", 2)
    for name, t, h in flood + [hank]:
        final = h.result()
        assert isinstance(final, Finished), final
        first[name] = t + final.usage.ttft_ms / 1e3
    later = sum(first[f"gina{i}"] > first["hank"] for i in range(20))
    assert later >= 10, sorted(first, key=first.get)


def test_a_refused_request_costs_no_templating(small_batch, monkeypatch):
    """A user at the limit who keeps sending is refused before the chat template runs: a
    flood's refusals must not take the cores the batch needs."""
    held = [small_batch.submit(req("ivy", f"q{i}", n=40)) for i in range(8)]
    calls = []
    real = small_batch.template
    monkeypatch.setattr(small_batch, "template", lambda r: calls.append(r) or real(r))
    with pytest.raises(RequestError) as info:
        small_batch.submit(req("ivy", "one too many"))
    assert info.value.status == 429
    with pytest.raises(RequestError) as info:
        asyncio.run(small_batch.asubmit(req("ivy", "and another")))
    assert info.value.status == 429 and not calls
    for h in held:
        h.cancel()
    for h in held:
        assert isinstance(h.result(), Finished)


def test_a_long_texts_templating_is_a_heavy_job_and_a_short_ones_is_not(small_batch, monkeypatch):
    """Counting the tokens of a long text holds the tokenizer's lock, which everyone's templating
    needs, for tens of milliseconds: heavy, so that a flood of them rests while others work."""
    monkeypatch.setattr(prepare, "HEAVY_TEXT_CHARS", 1_000)  # within this engine's context of 512 tokens
    heavy: list[bool] = []
    pool = small_batch._pool()
    real = pool.submit
    monkeypatch.setattr(pool, "submit", lambda *a, **kw: heavy.append(kw.get("heavy", False)) or real(*a, **kw))
    asyncio.run(small_batch.count_tokens(req("ivy", "hello world " * 100)))
    asyncio.run(small_batch.count_tokens(req("ivy", "a short question")))
    assert heavy == [True, False]
    small_batch.submit(req("ivy", "a long world " * 100, n=1)).result()
    assert heavy[-1] is True


def test_the_engine_starts_a_users_cached_request_before_an_uncached_one(tiny_model_dir):
    """One slot: of two waiting requests of one user, the one whose prompt is in the prefix
    cache starts first, though it was sent second (cache-aware admission)."""
    eng = Engine(
        Settings(model=str(tiny_model_dir), max_batch=1, max_prefill_batch=1, max_tokens=8, cache_sharing="user")
    ).start(timeout=120)
    try:
        seen = "a conversation this user had before, " * 6
        assert isinstance(eng.submit(req("jo", seen, n=4)).result(), Finished)  # now cached
        running = eng.submit(req("jo", "keeps the only slot busy", n=60))
        deadline = time.time() + 30
        while time.time() < deadline and not eng._by_uid:
            time.sleep(0.001)
        order: list[str] = []
        uncached = eng.submit(req("jo", "something never asked before, " * 6, n=4))
        again = eng.submit(req("jo", seen, n=4))
        for name, h in (("uncached", uncached), ("again", again)):
            h.add_done_callback(lambda final, name=name: order.append(name))
        for h in (running, uncached, again):
            assert isinstance(h.result(), Finished)
        assert again.final.usage.cached_tokens > 0
        assert order == ["again", "uncached"], order
    finally:
        eng.stop()


async def ended(handles) -> list:
    """Cancel asyncio handles and return each one's final event."""
    for h in handles:
        h.cancel()
    return [[ev async for ev in h][-1] for h in handles]


def test_requests_sent_at_once_past_the_limit_cost_no_templating(small_batch, monkeypatch):
    """Sixteen of mallory's requests arrive together against a limit of eight: the slot is
    taken before any work, so eight are prepared and eight refused at once (when the count
    was only read before templating, all sixteen passed it and were templated)."""
    calls = []
    real = small_batch.template

    def template(r):
        calls.append(r)
        time.sleep(0.02)
        return real(r)

    monkeypatch.setattr(small_batch, "template", template)

    async def flood():
        sent = [small_batch.asubmit(req("mallory", f"q{i}", n=40)) for i in range(16)]
        out = await asyncio.gather(*sent, return_exceptions=True)
        held = [h for h in out if not isinstance(h, BaseException)]
        return out, held, await ended(held)

    out, held, finals = asyncio.run(flood())
    refused = [e for e in out if isinstance(e, RequestError)]
    assert len(held) == 8 and len(refused) == 8, out
    assert all(e.status == 429 and e.code == "user_limit" for e in refused)
    assert len(calls) == 8 and all(isinstance(f, Finished) for f in finals)
    assert small_batch.owners["mallory"] == 0 and small_batch.stats().inflight == 0


def test_the_queue_limit_is_taken_before_templating_too(small_batch, monkeypatch):
    calls = []
    real = small_batch.template
    monkeypatch.setattr(small_batch, "template", lambda r: calls.append(r) or real(r))
    monkeypatch.setattr(small_batch.settings, "max_queue", 3)

    async def flood():
        sent = [small_batch.asubmit(req(f"user{i}", "hello", n=40)) for i in range(6)]
        out = await asyncio.gather(*sent, return_exceptions=True)
        held = [h for h in out if not isinstance(h, BaseException)]
        return out, held, await ended(held)

    out, held, _ = asyncio.run(flood())
    assert len(held) == 3 and len(calls) == 3, out
    assert all(isinstance(e, RequestError) and e.code == "queue_full" for e in out if e not in held)
    assert small_batch.stats().inflight == 0


def test_a_users_request_is_prepared_after_about_one_of_a_floods_slow_preparations(small_batch, monkeypatch):
    """Eight of mallory's slow templatings (each holding the tokenizer, as a long
    conversation's does) are queued before alice's request: alice waits for about one of
    them, not all eight (in asyncio's shared pool she waited behind the flood)."""
    slow = 0.3
    real = small_batch.template

    def template(r):
        if r.owner == "mallory":
            with small_batch._tok_lock:
                time.sleep(slow)
        return real(r)

    monkeypatch.setattr(small_batch, "template", template)

    async def main():
        flood = [asyncio.ensure_future(small_batch.asubmit(req("mallory", f"slow {i}", n=2))) for i in range(8)]
        await asyncio.sleep(slow / 3)  # mallory's first is being templated, the rest wait
        t = time.perf_counter()
        mine = await small_batch.asubmit(req("alice", "a quick one", n=2))
        waited = time.perf_counter() - t
        flood_done = [f.done() for f in flood]
        return waited, flood_done, await ended([*await asyncio.gather(*flood), mine])

    waited, flood_done, finals = asyncio.run(main())
    assert waited < 2 * slow, waited
    assert sum(flood_done) <= 2, flood_done  # she did not wait for the flood
    assert all(isinstance(f, Finished) for f in finals)
    assert small_batch.stats().inflight == 0


def test_the_preparation_pool_serves_the_least_served_owner_first():
    pool = FairPool(1)
    order, gate = [], threading.Event()
    first = pool.submit("mallory", gate.wait, 10)
    flood = [pool.submit("mallory", order.append, f"m{i}") for i in range(4)]
    mine = pool.submit("alice", order.append, "a0")
    dropped = pool.submit("mallory", order.append, "dropped")
    assert dropped.cancel()  # a caller that gave up: its job never runs
    gate.set()
    for f in [first, *flood, mine]:
        f.result(10)
    assert order == ["a0", "m0", "m1", "m2", "m3"], order


def test_a_newcomers_job_starts_at_once_while_a_flood_holds_every_worker():
    """Two workers, both compiling mallory's slow grammars: alice's templating waited for one
    of them to end (~155 ms for a 64 KB regex schema here). Now it starts at once, on a
    thread beyond the two; mallory never runs more than two at a time."""
    pool = FairPool(2)
    gate, running, most = threading.Event(), Counter(), [0]
    lock = threading.Lock()

    def slow(who):
        with lock:
            running[who] += 1
            most[0] = max(most[0], running["mallory"])
        gate.wait(10)
        with lock:
            running[who] -= 1

    flood = [pool.submit("mallory", slow, "mallory") for _ in range(6)]
    deadline = time.time() + 5
    while running["mallory"] < 2 and time.time() < deadline:
        time.sleep(0.005)
    mine = pool.submit("alice", lambda: "templated")
    assert mine.result(2) == "templated"  # before any of the flood's ended
    assert not any(f.done() for f in flood)
    second = [pool.submit("alice", lambda: "again"), pool.submit("bob", lambda: "bob's")]
    assert [f.result(2) for f in second] == ["again", "bob's"]
    gate.set()
    for f in flood:
        f.result(10)
    assert most[0] == 2


def test_serial_jobs_run_one_at_a_time_and_leave_a_worker_to_the_others():
    """Two workers: while one runs a serial job (templating holds the tokenizer), the other
    takes a plain job (a grammar to compile) rather than block behind the serial one."""
    pool = FairPool(2)
    gate, order = threading.Event(), []
    busy = pool.submit("mallory", gate.wait, 10, serial=True)
    waiting = pool.submit("mallory", order.append, "serial", serial=True)
    plain = pool.submit("alice", order.append, "plain")
    plain.result(10)
    assert order == ["plain"] and not waiting.done()
    gate.set()
    busy.result(10)
    waiting.result(10)
    assert order == ["plain", "serial"]


def test_a_newcomers_short_prompt_is_prefilled_within_steps_of_a_long_prompt_flood(tiny_model_dir):
    """mallory keeps eight long prompts in prefill, more than the step's room prefills at
    once; alice's short prompt starts at the next step (hurried), so her first token comes
    a few steps after she asks, not after mallory's prompts (it came after all of them when
    the generator prefilled in arrival order)."""
    eng = Engine(
        Settings(model=str(tiny_model_dir), max_batch=32, max_prefill_batch=8, step_tokens=64, max_tokens=4)
    ).start(timeout=120)
    try:
        flood = [eng.submit(req("mallory", f"long question {i}: " + "words " * 120, n=2)) for i in range(8)]
        deadline = time.time() + 30
        while time.time() < deadline and not any(a.t_admitted for a in list(eng._by_uid.values())):
            time.sleep(0.001)
        steps = eng.steps
        alice = eng.submit(req("alice", "short one", n=1)).result()
        waited = eng.steps - steps
        assert isinstance(alice, Finished)
        firsts = [h.result() for h in flood]
        assert all(isinstance(f, Finished) for f in firsts)
        assert not all(f.usage.ttft_ms < alice.usage.ttft_ms for f in firsts)
        assert waited <= 4, waited  # her prompt's chunk, her first token; a step under way
    finally:
        eng.stop()


def test_only_a_newcomer_beside_others_work_takes_a_step_of_its_own(tiny_model_dir):
    """A step of its own (core.engine.step.stepper `_first_alone`) is for an owner with no row while
    others have rows: mallory's third request, beside two rows of hers, goes the ordinary way
    (her throughput alone is what it was), alice's first goes alone."""
    eng = Engine(Settings(model=str(tiny_model_dir), max_batch=16, max_tokens=64)).start(timeout=120)
    alone: list[str] = []
    gen, first_alone = eng._gen, eng._gen._first_alone

    def spy(k, room):  # the engine thread's
        responses = first_alone(k, room)
        alone.extend(eng._by_uid[r.uid].owner for r in responses or [] if r.uid in eng._by_uid)
        return responses

    gen._first_alone = spy

    def first_token_of(owner: str) -> None:
        deadline = time.time() + 30
        while time.time() < deadline:
            if any(a.owner == owner and a.t_first for a in list(eng._by_uid.values())):
                return
            time.sleep(0.001)
        raise AssertionError(f"no first token for {owner}")

    try:
        running = [eng.submit(req("mallory", f"a long one {i}", n=60)) for i in range(2)]
        first_token_of("mallory")
        third = eng.submit(req("mallory", "and another", n=4))
        assert isinstance(third.result(), Finished)
        ask = eng.submit(req("alice", "hello there", n=4))
        assert isinstance(ask.result(), Finished)
        assert all(isinstance(h.result(), Finished) for h in running)
        assert alone == ["alice"], alone
    finally:
        eng.stop()


def test_a_newcomer_admitted_beside_another_owners_first_rows_takes_a_step_of_its_own(tiny_model_dir):
    """The engine idle, mallory's request (four rows) and alice's arrive in the same turn:
    nobody is decoding yet, but mallory's rows join alice's. Alice's first token comes from
    a step of her own (before, only mallory's first row was marked for one: alice went into
    the shared prefill behind it, under the tiny model's n=16 flood her slowest turns)."""
    from radixchat.core.engine.active import Wake

    eng = Engine(Settings(model=str(tiny_model_dir), max_batch=16, max_tokens=32)).start(timeout=120)
    alone: list[str] = []
    first_alone = eng._gen._first_alone

    def spy(k, room):  # the engine thread's
        responses = first_alone(k, room)
        alone.extend(eng._by_uid[r.uid].owner for r in responses or [] if r.uid in eng._by_uid)
        return responses

    eng._gen._first_alone = spy
    parked, go = threading.Event(), threading.Event()
    drain = eng._drain_commands

    def gated(block: bool) -> None:  # the engine thread's: wait before draining, once
        if not go.is_set():
            parked.set()
            go.wait(30)
        drain(block)

    try:
        warm = eng.submit(req("carol", "warm up", n=2)).result()
        assert isinstance(warm, Finished)
        eng._drain_commands = gated
        eng._cmds.put(Wake())  # one more turn, so the next one parks at the gate
        assert parked.wait(30)
        theirs = [eng.submit(req("mallory", f"row {i} of hers", n=24)) for i in range(4)]
        ask = eng.submit(req("alice", "hello there", n=4))
        go.set()
        assert isinstance(ask.result(), Finished)
        assert all(isinstance(h.result(), Finished) for h in theirs)
    finally:
        go.set()
        eng.stop()
    assert "alice" in alone, alone


def test_a_step_alone_waits_for_the_first_token_of_a_user_prefilled_before(tiny_model_dir):
    """Alice alone on the engine: her prompt is prefilled the ordinary way and her first
    token is due from the next step. Mallory's request comes in between (her first, beside
    alice's row: a newcomer for a step of her own). The next step returns alice's token; a
    step alone for mallory first held it back a step (under the n=16 flood, after mallory's
    rows had all ended, alice's slowest turns)."""
    from radixchat.core.engine.active import Wake

    eng = Engine(Settings(model=str(tiny_model_dir), max_batch=16, max_tokens=32)).start(timeout=120)
    alone: list[str] = []
    first_alone, on_prompt, drain = eng._gen._first_alone, eng._gen.on_prompt, eng._drain_commands
    prefilled, parked, go = threading.Event(), threading.Event(), threading.Event()

    def spy(k, room):  # the engine thread's
        responses = first_alone(k, room)
        alone.extend(eng._by_uid[r.uid].owner for r in responses or [] if r.uid in eng._by_uid)
        return responses

    def seen(responses) -> None:  # the engine thread's
        on_prompt(responses)
        if any(r.end_of_prompt and eng._by_uid[r.uid].owner == "alice" for r in responses if r.uid in eng._by_uid):
            prefilled.set()

    def gated(block: bool) -> None:  # the engine thread's: once alice is prefilled, wait before draining
        if prefilled.is_set() and not go.is_set():
            parked.set()
            go.wait(30)
        drain(block)

    try:
        assert isinstance(eng.submit(req("carol", "warm up", n=2)).result(), Finished)
        eng._gen._first_alone, eng._gen.on_prompt, eng._drain_commands = spy, seen, gated
        ask = eng.submit(req("alice", "hello there", n=4))
        assert parked.wait(30)
        theirs = eng.submit(req("mallory", "a question of hers", n=8))
        go.set()
        eng._cmds.put(Wake())
        assert isinstance(ask.result(), Finished) and isinstance(theirs.result(), Finished)
    finally:
        go.set()
        eng.stop()
    assert alone == [], alone


def test_heavy_jobs_leave_a_core_and_a_newcomers_compile_still_starts():
    """One heavy job at a time (a 2-core machine's all but one): mallory's grammar compiles
    run one after another beside the engine's forward, while another user's compile and
    anyone's light jobs start at once."""
    pool = FairPool(2, heavy=1)
    gate, running, most = threading.Event(), Counter(), Counter()
    lock = threading.Lock()

    def compile_(who):
        with lock:
            running[who] += 1
            most[who] = max(most[who], running[who])
        gate.wait(10)
        with lock:
            running[who] -= 1

    flood = [pool.submit("mallory", compile_, "mallory", heavy=True) for _ in range(4)]
    deadline = time.time() + 5
    while running["mallory"] < 1 and time.time() < deadline:
        time.sleep(0.005)
    light = pool.submit("mallory", lambda: "templated")  # queued behind her compiles: her order
    theirs = pool.submit("alice", compile_, "alice", heavy=True)
    deadline = time.time() + 5
    while running["alice"] < 1 and time.time() < deadline:
        time.sleep(0.005)
    assert running["alice"] == 1 and running["mallory"] == 1  # hers started beside mallory's one
    assert pool.submit("bob", lambda: "bob's").result(2) == "bob's"
    gate.set()
    for f in [*flood, theirs]:
        f.result(10)
    assert light.result(10) == "templated"
    assert most["mallory"] == 1


def _timed_compiles(pool: FairPool, owner: str, n: int, seconds: float) -> list[tuple[float, float]]:
    """`n` heavy jobs of `owner`, each `seconds` long, queued at once: each one's (start, end)."""
    spans: list[tuple[float, float]] = []

    def compile_():
        start = time.monotonic()
        time.sleep(seconds)
        spans.append((start, time.monotonic()))

    for f in [pool.submit(owner, compile_, heavy=True) for _ in range(n)]:
        f.result(10)
    return spans


def test_a_users_compiles_rest_twice_their_length_while_anyone_else_is_at_work():
    """Beside other programs there is no spare core for mallory's compiles: while alice is at
    work, each of them is followed by a rest of twice its length, and alice's own compile
    does not wait for mallory's rest. Alone, mallory's run back to back."""
    alice_at_work = threading.Event()
    pool = FairPool(2, heavy=1, others=lambda owner: owner != "alice" and alice_at_work.is_set())
    alone = _timed_compiles(pool, "mallory", 3, 0.1)
    assert all(b[0] - a[1] < 0.1 for a, b in itertools.pairwise(alone)), alone

    alice_at_work.set()
    paced = _timed_compiles(pool, "mallory", 3, 0.1)
    assert all(b[0] - a[1] >= 2 * (a[1] - a[0]) for a, b in itertools.pairwise(paced)), paced

    flood = [pool.submit("mallory", time.sleep, 0.1, heavy=True) for _ in range(2)]
    time.sleep(0.05)  # mallory's first is running: the next rests after it
    asked = time.monotonic()
    [(start, _)] = _timed_compiles(pool, "alice", 1, 0.01)
    assert start - asked < 0.2  # beside mallory's one (her own heavy slot), never behind her rest
    for f in flood:
        f.result(10)


def test_a_user_counts_as_at_work_between_two_turns_and_not_after():
    owners = OwnerCounts()
    assert not owners.others_at_work("mallory")
    owners.take("alice", 4)
    assert owners.others_at_work("mallory") and not owners.others_at_work("alice")
    owners.give("alice")
    assert owners.others_at_work("mallory", linger_s=10)  # reading the reply, typing the next
    time.sleep(0.02)
    assert not owners.others_at_work("mallory", linger_s=0.01)
