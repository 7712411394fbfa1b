"""The engine's seams with its callers: templating off the event loop and outside the
engine's lock, linear templating for hybrid models, and submits that race a stop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from radixchat.core.config import Settings
from radixchat.core.engine.engine import Engine
from radixchat.core.seam.requests import ChatRequest, Failed, Finished, RequestError, Sampling

SYSTEM = {"role": "system", "content": "You answer questions about Python."}


def ask(text: str, max_tokens: int = 4) -> ChatRequest:
    return ChatRequest(messages=[SYSTEM, {"role": "user", "content": text}], sampling={"max_tokens": max_tokens})


def in_thread(fn, timeout: float):
    """Run fn in a thread; (done, result) after at most `timeout` seconds."""
    out: list = []
    th = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    th.start()
    th.join(timeout)
    return bool(out), (out[0] if out else None)


def test_a_slow_chat_template_blocks_nobody_else(engine, monkeypatch):
    """A long conversation's template must not hold the lock that admission and the
    engine thread's release take: other requests go on meanwhile."""
    tok = engine.loaded.tokenizer
    real = tok.apply_chat_template
    entered, release = threading.Event(), threading.Event()

    def slow(messages, *a, **kw):
        if messages[-1]["content"] == "slow one":
            entered.set()
            release.wait(30)
        return real(messages, *a, **kw)

    monkeypatch.setattr(tok, "apply_chat_template", slow)
    slow_thread = threading.Thread(target=lambda: engine.submit(ask("slow one")).result(), daemon=True)
    slow_thread.start()
    try:
        assert entered.wait(10)
        done, final = in_thread(lambda: engine.submit_tokens([1, 2, 3, 4], Sampling(max_tokens=3)).result(), 20)
        assert done, "a tokenized request waited for another request's chat template"
        assert isinstance(final, Finished) and final.usage.generated_tokens == 3
    finally:
        release.set()
        slow_thread.join(30)


def test_asubmit_templates_off_the_event_loop(engine, monkeypatch):
    tok = engine.loaded.tokenizer
    real = tok.apply_chat_template
    threads = []

    def spy(*a, **kw):
        threads.append(threading.current_thread())
        return real(*a, **kw)

    monkeypatch.setattr(tok, "apply_chat_template", spy)

    async def main():
        loop_thread = threading.current_thread()
        handle = await engine.asubmit(ask("off the loop, please"))
        final = None
        async for ev in handle:
            final = ev
        return loop_thread, final

    loop_thread, final = asyncio.run(main())
    assert isinstance(final, Finished)
    assert threads and all(t is not loop_thread for t in threads)


def test_asubmit_refuses_like_submit(engine):
    async def main():
        await engine.asubmit(ChatRequest(messages=[{"role": "user", "content": "x " * 5000}]))

    with pytest.raises(RequestError) as info:
        asyncio.run(main())
    assert info.value.status == 413
    assert engine.stats().inflight == 0


@pytest.fixture(scope="module")
def hybrid_engine(tiny_hybrid_dir):
    eng = Engine(Settings(model=str(tiny_hybrid_dir), max_batch=4, max_tokens=8)).start(timeout=120)
    yield eng
    eng.stop()


def test_hybrid_templating_is_linear_in_the_conversation(hybrid_engine, monkeypatch):
    """Snapshot boundaries for a model with non-trimmable layers take a bounded number of
    templatings, not one per message (which made a long conversation quadratic)."""
    tok = hybrid_engine.loaded.tokenizer
    real = tok.apply_chat_template
    calls = []

    def count(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(tok, "apply_chat_template", count)
    messages = [SYSTEM]
    for i in range(20):
        messages += [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]
    messages.append({"role": "user", "content": "last question"})
    p = hybrid_engine.template(ChatRequest(messages=messages))
    assert len(calls) <= 3, len(calls)
    # a snapshot after the system prompt (shared by conversations) and before the last message
    sys_end = len(real([SYSTEM]))
    prev_end = len(real(messages[:-1]))
    assert p.boundaries == [sys_end, prev_end] and prev_end < len(p.tokens)
    assert p.shared_len == sys_end


def test_hybrid_multi_turn_still_hits_the_cache(hybrid_engine):
    """With the fewer boundaries, a conversation's next turn restores its previous turn."""
    first = [SYSTEM, {"role": "user", "content": "What is a list?"}]
    a1 = hybrid_engine.submit(ChatRequest(messages=first, sampling={"max_tokens": 6})).result()
    assert isinstance(a1, Finished)
    second = first + [{"role": "assistant", "content": a1.text}, {"role": "user", "content": "And a tuple?"}]
    a2 = hybrid_engine.submit(ChatRequest(messages=second, sampling={"max_tokens": 6})).result()
    assert isinstance(a2, Finished)
    sys_end = len(hybrid_engine.loaded.tokenizer.apply_chat_template([SYSTEM]))
    assert a2.usage.cached_tokens > sys_end, (a2.usage.cached_tokens, sys_end)


def test_continuing_an_answer_prompts_with_its_tokens_after_the_question(engine):
    """continue_final: the question's prompt as any reply is written after, then the cut
    answer's text as the model's own tokens (no end of turn), so the cache holds the question."""
    tok = engine.loaded.tokenizer
    question = [SYSTEM, {"role": "user", "content": "What is a set?"}]
    first = engine.submit(ChatRequest(messages=question, sampling={"max_tokens": 6})).result()
    assert isinstance(first, Finished) and first.finish_reason == "length"
    cut = first.text.rstrip() or "A set"
    going_on = ChatRequest(
        messages=[*question, {"role": "assistant", "content": cut}], sampling={"max_tokens": 4}, continue_final=True
    )
    asked = list(tok.apply_chat_template(question, add_generation_prompt=True))
    assert engine.template(going_on).tokens == asked + list(tok.encode(cut, add_special_tokens=False))
    more = engine.submit(going_on).result()
    assert isinstance(more, Finished) and more.usage.generated_tokens == 4
    assert more.usage.cached_tokens >= len(asked), (more.usage.cached_tokens, len(asked))


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "hi"}],  # nothing to go on from
        [{"role": "assistant", "content": "hi"}],  # nothing before it
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]}],
    ],
)
def test_continuing_needs_an_answer_after_a_message(messages):
    with pytest.raises(ValueError, match="continuing needs"):
        ChatRequest(messages=messages, continue_final=True)
    if messages[-1]["role"] == "assistant":  # and without the flag, an answer last is refused
        with pytest.raises(ValueError, match="the last message must come from the user"):
            ChatRequest(messages=messages)


def test_a_submit_that_races_the_stop_is_answered(tiny_model_dir):
    """The stop drains the queue; a submit whose check passed before the stop but whose
    command lands after the drain must still get a final event, not hang."""
    eng = Engine(Settings(model=str(tiny_model_dir), max_tokens=4)).start(timeout=120)
    prompt = list(eng.loaded.tokenizer.encode("hello there"))
    eng.stop()
    assert not eng._thread.is_alive()
    # replay the interleaving: the checks in submit_tokens ran while the engine still ran,
    # and its command is queued after the engine's last drain
    closed, eng._stopping, eng._closed = eng._closed, False, False

    class LateQueue:
        def __init__(self, q):
            self.q = q

        def put(self, cmd):
            eng._closed = closed
            self.q.put(cmd)

        def __getattr__(self, name):
            return getattr(self.q, name)

    eng._cmds = LateQueue(eng._cmds)
    done, final = in_thread(lambda: eng.submit_tokens(prompt, Sampling(max_tokens=4)).result(), 10)
    assert done, "a submit that raced the stop was never answered"
    assert isinstance(final, Failed) and "stopped" in final.message
    assert eng.stats().inflight == 0


def test_a_request_queued_behind_a_hung_step_gets_the_fatal_reason(tiny_model_dir, monkeypatch):
    """A sharded rank 0 whose peer hangs is stuck inside a message or a step; its watchdog
    calls `_fatal` from its own thread. A request that arrived just before was still in the
    command queue, which nobody would read again: its stream stayed open until the server
    stopped, and the client saw it end with no error. It fails with the reason at once."""
    eng = Engine(Settings(model=str(tiny_model_dir), max_tokens=4)).start(timeout=120)
    stuck, release = threading.Event(), threading.Event()
    schedule = eng._schedule

    def hung_schedule():  # the engine thread blocks, as in a collective whose peer stopped
        stuck.set()
        release.wait(30)
        schedule()

    monkeypatch.setattr(eng, "_schedule", hung_schedule)
    eng._cmds.put(None)  # wake the idle loop, so that it goes on into the hung part
    try:
        assert stuck.wait(10)
        handle = eng.submit(ask("what is a list?"))  # queued: the engine thread is stuck
        eng._fatal("a rank stopped answering: the server stops")
        done, final = in_thread(handle.result, 5)
        assert done, "a request queued behind the hung step was never answered"
        assert isinstance(final, Failed) and final.message == "a rank stopped answering: the server stops"
        with pytest.raises(RequestError):  # and a submit after it is refused
            eng.submit(ask("and a dict?"))
    finally:
        release.set()
        eng.stop()


def test_a_count_is_charged_to_its_owner_like_a_request(tiny_model_dir):
    """A token count templates in its owner's turn and counts against their limit while it
    runs: an owner at the limit is refused a count too (a flood of counts ran uncounted)."""
    eng = Engine(
        Settings(model=str(tiny_model_dir), max_batch=4, max_tokens=2000, max_user_requests=1, max_queue=8)
    ).start(timeout=120)
    try:
        owner = "o" * 16
        asked = ChatRequest(messages=[SYSTEM, {"role": "user", "content": "hi"}], owner=owner)
        running = eng.submit(
            ChatRequest(
                messages=[SYSTEM, {"role": "user", "content": "tell"}], owner=owner, sampling={"max_tokens": 2000}
            )
        )
        with pytest.raises(RequestError) as refused:
            asyncio.run(eng.count_tokens(asked))
        assert refused.value.status == 429, refused.value
        other = ChatRequest(messages=asked.messages, owner="p" * 16)
        assert asyncio.run(eng.count_tokens(other)) > 0  # another owner is not held up
        running.cancel()
        running.result()
        assert asyncio.run(eng.count_tokens(asked)) == asyncio.run(eng.count_tokens(other))
        assert eng.stats().inflight == 0  # every count gave its slot back
    finally:
        eng.stop()
