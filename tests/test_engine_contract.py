"""The seam's contract (core.seam.protocol.EngineClient), one test run over every engine the web
layer may hold: the in-process `Engine`, a `RemoteEngine` (a worker on another process), a
`RoutedEngine` (workers behind SGLang's router) and the tests' `FakeEngine`. Whatever webui/
relies on (a reply's events add up to its text, a cancel ends a request as cancelled, a
refusal is a RequestError with an HTTP status, the counts in `stats`) holds for each of them;
the engines in other processes are the slow tier's."""

from __future__ import annotations

import asyncio
import time

import pytest

from radixchat.core.config import Settings
from radixchat.core.seam.protocol import EngineClient, EngineStats, Lifecycle, ModelInfo
from radixchat.core.seam.requests import (
    ChatMessage,
    ChatRequest,
    Finished,
    PromptRequest,
    RequestError,
    Sampling,
    TextDelta,
)
from tests.support.fake_engine import FakeEngine

LONG = 1900  # tokens of a reply that runs until it is cancelled: seconds on `slow_model`


class Subject:
    """An engine under the contract, and how to keep one of its requests running."""

    def __init__(self, engine, *, hold=None):
        self.engine = engine
        self._hold = hold  # the fake's: it answers at once unless held

    def long_request(self) -> ChatRequest:
        if self._hold is not None:
            self._hold(True)
        return ask("Tell me a long story.", max_tokens=LONG, ignore_eos=True)

    def done_holding(self) -> None:
        if self._hold is not None:
            self._hold(False)


def ask(text: str, **sampling) -> ChatRequest:
    return ChatRequest(messages=[ChatMessage(role="user", content=text)], sampling=Sampling(**sampling))


def _fake() -> Subject:
    fake = FakeEngine("one two three four five")

    def hold(on: bool) -> None:
        fake.hold = on

    return Subject(fake, hold=hold)


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory):
    """A model whose long reply lasts seconds (a remote engine's counts are a second old)."""
    from tests.support.randmodel import build_random_model

    return build_random_model(tmp_path_factory.mktemp("contract") / "model", dim=128, layers=4, context=2048)


@pytest.fixture(
    scope="module",
    params=[
        "fake",
        "engine",
        pytest.param("remote", marks=pytest.mark.slow),
        pytest.param("routed", marks=pytest.mark.slow),
    ],
)
def subject(request, slow_model, tmp_path_factory):
    kind = request.param
    if kind == "fake":
        yield _fake()
        return
    if kind == "engine":
        from radixchat.core.engine.engine import Engine

        eng = Engine(Settings(model=str(slow_model), max_tokens=LONG, cache_disk_bytes=0)).start(timeout=120)
        try:
            yield Subject(eng)
        finally:
            eng.stop()
        return
    from radixchat.webui.remote.remote_engine import RemoteEngine
    from radixchat.webui.remote.routed_engine import RoutedEngine
    from tests.support.workers import KEY, Router, Worker

    folder = tmp_path_factory.mktemp(kind)
    count = 1 if kind == "remote" else 2
    workers, router, eng = [], None, None
    try:
        for _ in range(count):
            workers.append(Worker(slow_model, folder, "--max-tokens", str(LONG)))
        if kind == "remote":
            eng = RemoteEngine.connect(workers[0].url, KEY)
        else:
            router = Router([w.url for w in workers])
            eng = RoutedEngine.connect_router(router.url, KEY, [w.url for w in workers])
        yield Subject(eng)
    finally:
        if eng is not None:
            eng.stop()
        if router is not None:
            router.stop()
        for w in workers:
            assert "Traceback" not in w.stop()


def events_of(handle) -> list:
    return list(handle)


def idle(eng, within: float = 10.0) -> bool:
    """Does `eng` count nothing in flight, within `within` s? (A remote engine's counts are
    polled: up to a second old.)"""
    deadline = time.monotonic() + within
    while eng.stats().inflight and time.monotonic() < deadline:
        time.sleep(0.02)
    return eng.stats().inflight == 0


def test_it_is_an_engine_client_that_says_what_it_serves(subject):
    eng = subject.engine
    assert isinstance(eng, EngineClient)
    info = eng.info
    assert isinstance(info, ModelInfo) and info.model_id and info.context_length > 0 and info.vocab_size > 0


def test_a_replys_deltas_add_up_to_its_one_final_event(subject):
    handle = subject.engine.submit(ask("Say something.", max_tokens=4))
    events = events_of(handle)
    final = events[-1]
    assert isinstance(final, Finished), events
    assert all(isinstance(e, TextDelta) for e in events[:-1])
    assert "".join(e.text for e in events[:-1]) == final.text
    assert final.finish_reason in ("stop", "length")
    assert 1 <= final.usage.generated_tokens <= 4 and final.usage.prompt_tokens > 0
    assert handle.prompt_tokens == final.usage.prompt_tokens


def test_a_request_submitted_from_an_event_loop_is_read_on_it(subject):
    async def chat() -> list:
        handle = await subject.engine.asubmit(ask("Say something else.", max_tokens=3))
        return [e async for e in handle]

    events = asyncio.run(chat())
    assert isinstance(events[-1], Finished)
    assert "".join(e.text for e in events[:-1]) == events[-1].text


def test_a_running_request_is_counted_and_a_cancel_ends_it_as_cancelled(subject):
    eng = subject.engine
    handle = eng.submit(subject.long_request())
    try:
        deadline = time.monotonic() + 30
        while eng.stats().inflight < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        stats = eng.stats()
        assert isinstance(stats, EngineStats) and stats.inflight >= 1
        eng.cancel(handle.id)
        final = events_of(handle)[-1]
        assert isinstance(final, Finished) and final.finish_reason == "cancelled"
        assert final.usage is None or final.usage.generated_tokens < LONG
    finally:
        subject.done_holding()
    assert idle(eng)


def test_a_prompt_longer_than_the_context_is_refused_with_an_http_status(subject):
    eng = subject.engine
    words = " ".join(["word"] * (eng.info.context_length * 2))
    with pytest.raises(RequestError) as refused:
        eng.submit(ask(words, max_tokens=4))
    assert 400 <= refused.value.status < 500 and str(refused.value)
    assert idle(eng)  # nothing of it stays counted


def test_a_plain_prompt_and_its_tokens(subject):
    eng = subject.engine
    tokens = eng.tokenize("hello there")
    assert tokens and all(isinstance(t, int) and 0 <= t < eng.info.vocab_size for t in tokens)
    final = events_of(eng.submit(PromptRequest(prompt="hello there", sampling=Sampling(max_tokens=2))))[-1]
    assert isinstance(final, Finished) and final.usage.prompt_tokens >= 1


def test_count_tokens_counts_without_queueing(subject):
    eng = subject.engine
    short, longer = ask("hi"), ask("hi " * 40)
    n_short, n_long = asyncio.run(eng.count_tokens(short)), asyncio.run(eng.count_tokens(longer))
    assert 0 < n_short < n_long
    assert idle(eng)


def test_forgetting_returns_at_once_and_the_engine_goes_on(subject):
    eng = subject.engine
    tic = time.monotonic()
    eng.forget("somebody")
    eng.forget_conversation("somebody", [{"role": "user", "content": "a deleted chat"}])
    assert time.monotonic() - tic < 5
    final = events_of(eng.submit(ask("Still there?", max_tokens=2)))[-1]
    assert isinstance(final, Finished)


def test_a_set_of_models_halts_each_and_reports_a_fatal_stop():
    """The composition root drives a set of engines as it drives one (Lifecycle)."""
    from radixchat.core.engine.models import ModelSet

    fake = FakeEngine()
    models = ModelSet.one(fake)
    assert isinstance(models, Lifecycle) and models.fatal is None
    fake.hold = True
    handle = models.default.submit(ask("Wait for me.", max_tokens=4))
    models.halt()
    final = events_of(handle)[-1]
    assert isinstance(final, Finished) and final.finish_reason == "cancelled"
    fake.fatal = "a rank was lost"
    assert models.fatal == "a rank was lost"
    models.stop()  # the server reads it after the stop, when the set holds no engine any more
    assert models.fatal == "a rank was lost"


# last for each engine (a module's tests run in order for each of its params): it stops it
def test_halting_ends_what_is_in_flight_as_cancelled(subject):
    eng = subject.engine
    assert isinstance(eng, Lifecycle) and eng.fatal is None
    handle = eng.submit(subject.long_request())
    try:
        deadline = time.monotonic() + 30
        while eng.stats().inflight < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        eng.halt()
        final = events_of(handle)[-1]
        assert isinstance(final, Finished) and final.finish_reason == "cancelled"
    finally:
        subject.done_holding()
