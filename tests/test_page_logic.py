"""The chat page's handlers without a browser: the sidebar's chats, replies, stop, notices, dashboard, banner."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from radixchat.core.seam.requests import QueueFull, RequestError
from radixchat.core.store import NotFound
from radixchat.webui.cli.main import serve_banner
from radixchat.webui.live_requests import LiveRequests
from radixchat.webui.page.logic import markup
from radixchat.webui.page.logic.chat_page import LOCAL_USER, ChatPage, PageError, visible_turns
from radixchat.webui.page.logic.dashboard import Presence, dashboard
from tests.support.cheap import cheap_scrypt
from tests.support.fake_engine import INFO as FAKE_INFO

CHEAP = cheap_scrypt()


@pytest.fixture
def users(store):
    return store.create_user("alice", "alice-password"), store.create_user("bob", "bob-password")


class Refusing:
    """An engine that refuses every request the way the real one does."""

    info = FAKE_INFO

    def __init__(self, error: Exception):
        self.error = error
        self.submitted = 0
        self.forgotten: list[tuple] = []

    async def asubmit(self, request):
        self.submitted += 1
        raise self.error

    def forget_conversation(self, owner, messages):
        self.forgotten.append((owner, messages))


class Counting:
    def __init__(self):
        self.rejections, self.finals = 0, []

    def rejected(self):
        self.rejections += 1

    def observe(self, final, model=None):
        self.finals.append(final)


class Held:
    """A store method that waits until `go` is set, so a test can act while it is under way."""

    def __init__(self, monkeypatch, store, name: str):
        self.entered, self.go = threading.Event(), threading.Event()
        self.calls = self.returned = 0
        real = getattr(store, name)

        def held(*args, **kwargs):
            self.calls += 1
            self.entered.set()
            self.go.wait(10)
            try:
                return real(*args, **kwargs)
            finally:
                self.returned += 1

        monkeypatch.setattr(store, name, held)


async def collect(agen) -> list:
    return [x async for x in agen]


def reply(page, user, conv, text, **kw) -> list:
    return asyncio.run(collect(page.reply(user, conv, text, **kw)))


# ---- the sidebar ----


def test_sidebar_lists_every_chat_newest_first_and_new_chat_reuses_an_empty_one(store, users):
    alice, _ = users
    page = ChatPage(Refusing(QueueFull(1)), store)
    assert page.start(alice) is None and page.conversations(alice) == []  # a first visit: a new chat, nothing made
    first = page.new_chat(alice, "Be brief.")
    again = page.new_chat(alice)  # still empty and untitled: the same one, and clean
    assert again.id == first.id and again.system_prompt == ""
    store.append_message(alice, first.id, "user", "What is a list?")
    page.rename(alice, first.id, "  Lists   and dicts ")
    second = page.new_chat(alice)
    assert second.id != first.id
    store.append_message(alice, second.id, "user", "What is a tuple?")
    old = store.create_conversation(alice, "Archived long ago")
    store.append_message(alice, old.id, "user", "sets")
    store.archive_conversation(alice, old.id)  # archived means nothing here: listed like any other
    assert [c.id for c in page.conversations(alice)] == [old.id, second.id, first.id]
    store.append_message(alice, first.id, "user", "And a dict?")  # activity moves a chat up
    assert page.find(alice) == [("Lists and dicts", first.id), ("Archived long ago", old.id), ("New chat", second.id)]
    with pytest.raises(PageError, match="empty"):
        page.rename(alice, first.id, "   ")
    with pytest.raises(PageError, match="first message"):
        page.rename(alice, None, "a new chat has no title yet")

    # the chat opened last is the one a reload, or another browser, opens
    assert page.start(alice) == first.id  # none noted yet: the newest
    page.show(alice, second.id)
    assert ChatPage(Refusing(QueueFull(1)), store).start(alice) == second.id
    assert page.messages(alice, None) == []  # a new chat shows nothing


def test_delete_hides_a_chat_at_once_and_undo_brings_it_back(store, users):
    alice, _ = users
    engine = Refusing(QueueFull(1))
    page = ChatPage(engine, store)
    keep, gone = page.new_chat(alice), None
    store.append_message(alice, keep.id, "user", "keep me")
    gone = page.new_chat(alice, "Be brief.")
    first = store.append_message(alice, gone.id, "user", "Walrus-1 delete me")
    store.edit_message(alice, gone.id, first.id, "Walrus-2 delete me too")  # a second version
    page.show(alice, gone.id)
    assert page.delete(alice, gone.id).id == gone.id
    # the engine forgets every way the chat's prompts began, as its owner's
    system = {"role": "system", "content": "Be brief."}
    assert engine.forgotten == [
        (page.owner(alice), [system, {"role": "user", "content": "Walrus-1 delete me"}]),
        (page.owner(alice), [system, {"role": "user", "content": "Walrus-2 delete me too"}]),
    ]
    assert [c.id for c in page.conversations(alice)] == [keep.id]
    assert page.find(alice, "walrus") == []
    assert page.start(alice) == keep.id  # the open one went: the newest opens
    with pytest.raises(PageError, match="no longer exists"):
        page.messages(alice, gone.id)
    with pytest.raises(PageError, match="nothing to delete"):
        page.delete(alice, None)
    assert page.undo_delete(alice, gone.id).id == gone.id
    [back] = page.messages(alice, gone.id)
    assert back["role"] == "user" and back["content"].startswith('Walrus-2 delete me too\n\n<span class="rc-branch">')
    with pytest.raises(PageError, match="Too late"):
        page.undo_delete(alice, gone.id)  # nothing to undo any more
    page.delete(alice, gone.id)
    with sqlite3.connect(store.path) as c:  # past the undo window
        c.execute("UPDATE conversations SET deleted = deleted - 3600")
    with pytest.raises(PageError, match="Too late"):
        page.undo_delete(alice, gone.id)


def test_a_user_never_reaches_another_users_chats(store, users):
    alice, bob = users
    page = ChatPage(Refusing(QueueFull(1)), store)
    conv = page.new_chat(alice)
    store.append_message(alice, conv.id, "user", "alice's secret")
    assert page.new_chat(bob).id != conv.id  # never another user's empty chat
    assert all(c.owner == bob.id for c in page.conversations(bob))
    for action in (
        lambda: page.messages(bob, conv.id),
        lambda: page.rename(bob, conv.id, "mine"),
        lambda: page.delete(bob, conv.id),
        lambda: page.show(bob, conv.id),
        lambda: page.set_system_prompt(bob, conv.id, "x"),
        lambda: page.export(bob, conv.id, "md"),
        lambda: page.share(bob, conv.id),
        lambda: reply(page, bob, conv.id, "hello"),
    ):
        with pytest.raises(PageError, match="no longer exists"):
            action()
    page.delete(alice, conv.id)
    with pytest.raises(PageError, match="Too late"):
        page.undo_delete(bob, conv.id)  # bob can't bring back what alice deleted
    page.undo_delete(alice, conv.id)
    assert page.stop(bob, conv.id) is False
    assert page.find(bob, "secret") == [] and page.start(bob) != conv.id
    assert [m.content for m in store.history(alice, conv.id)] == ["alice's secret"]


def test_search_finds_titles_and_messages_of_ones_own_chats(store, users):
    alice, bob = users
    page = ChatPage(Refusing(QueueFull(1)), store)
    trip = page.new_chat(alice)
    page.rename(alice, trip.id, "Trip")
    store.append_message(alice, trip.id, "user", "Is the <b>aquarium</b> in Lisbon open on Mondays?")
    tickets = page.new_chat(alice)
    page.rename(alice, tickets.id, "Aquarium tickets")
    store.append_message(alice, tickets.id, "user", "two adults")
    theirs = page.new_chat(bob)
    store.append_message(bob, theirs.id, "user", "the aquarium in bob's town")

    found = page.find(alice, "  aquarium ")
    assert [i for _, i in found] == [tickets.id, trip.id]  # a title match first
    assert found[0][0] == "Aquarium tickets"
    assert found[1][0].startswith("Trip — ") and "<b>aquarium</b> in Lisbon" in found[1][0]  # as typed
    assert [i for _, i in page.find(bob, "aquarium")] == [theirs.id]
    assert page.find(alice, 'AND "*') == [] and page.find(alice, "lisbon trip") == []


def test_the_view_follows_the_browsers_latest_change():
    """A message sent to a new chat right after "New chat" makes that chat and keeps it in
    view, whichever of the two events the server runs first."""
    from radixchat.webui.page.ui.layout import View

    for new_chat_first in (True, False):
        view = View(conv=7, epoch=3)
        steps = [lambda: view.follow(None, 4, change=True), lambda: view.follow(12, 4)]  # "New chat", its message  # noqa: B023
        for step in steps if new_chat_first else steps[::-1]:
            step()
        assert (view.conv, view.epoch) == (12, 4)
    view = View(conv=12, epoch=4)
    assert not view.follow(7, 3) and view.conv == 12  # a late reply's stamp: older, ignored
    assert view.follow(7, 5, change=True) and view.conv == 7  # a later pick


def test_no_sign_in_means_one_local_user_made_on_demand(store):
    page = ChatPage(Refusing(QueueFull(1)), store)
    first = page.user(None)
    assert first.name == LOCAL_USER and page.user(None) == first
    assert page.user("") == first
    with pytest.raises(NotFound):
        page.user("nobody")


# ---- notices ----


@pytest.mark.parametrize(
    "error, words",
    [
        (QueueFull(256), "busy"),
        (
            RequestError(
                "This model's maximum context length is 512 tokens. However, your messages resulted in 900 tokens."
                " Please reduce the length of the messages.",
                413,
                "context_length_exceeded",
            ),
            "too long for the model",
        ),
        (RequestError("the engine is not running", 503, "engine_unavailable"), "not available"),
        (RequestError("the model's chat template rejected these messages: bad"), "refused"),
        (
            RequestError(
                "you already have 1 request waiting or running, the most one user may have", 429, "user_limit"
            ),
            "You already have 1 request",
        ),
    ],
)
def test_refusals_are_readable_notices_and_store_nothing(store, users, error, words):
    alice, _ = users
    metrics = Counting()
    engine = Refusing(error)
    page = ChatPage(engine, store, metrics)
    conv = page.new_chat(alice)
    with pytest.raises(PageError) as e:
        reply(page, alice, conv.id, "What is a tuple?")
    assert words in e.value.message and error.message.rstrip(".")[1:] in e.value.message
    assert ".." not in e.value.message and "busy" not in e.value.message * (error.code == "user_limit")
    assert "Traceback" not in e.value.message and e.value.message[0].isupper()
    assert engine.submitted == 1 and metrics.rejections == 1
    assert store.history(alice, conv.id) == [] and page.conversation(alice, conv.id).title == "New chat"
    assert page.running == {}
    # the first message of a new chat refused: no empty "New chat" left in the sidebar
    with pytest.raises(PageError):
        reply(page, alice, None, "What is a set?")
    assert page.conversations(alice) == [] and page.find(alice) == []


def test_bad_input_is_refused_before_the_engine(store, users):
    alice, _ = users
    engine = Refusing(QueueFull(1))
    page = ChatPage(engine, store)
    conv = page.new_chat(alice)
    with pytest.raises(PageError, match="Type a message"):
        reply(page, alice, conv.id, "   ")
    with pytest.raises(PageError, match="temperature"):
        reply(page, alice, conv.id, "hi", temperature=9.0)
    with pytest.raises(PageError, match="no message to answer"):
        reply(page, alice, conv.id, None, regenerate=True)
    assert engine.submitted == 0


# ---- replies on the real engine ----


def test_reply_streams_is_stored_with_metrics_and_cached_prefix(engine, store, users):
    alice, _ = users
    metrics = Counting()
    page = ChatPage(engine, store, metrics)
    conv = page.new_chat(alice, "You are a terse Python tutor. Answer about lists and dicts.")
    shown = reply(page, alice, conv.id, "What does list.append do?", temperature=0, max_tokens=200)
    assert len(shown) >= 3  # at once, while streaming, at the end
    assert shown[0][-1]["content"].endswith("▍") and shown[0][0]["content"].startswith(
        "What does list.append do?\n\n<!--rc-src:"  # its text as typed, for its copy button
    )
    partials = [s[-1]["content"] for s in shown[1:-1]]
    assert len(set(partials)) == len(partials) >= 1  # text grows between updates
    final = shown[-1][-1]["content"]
    assert "prompt tokens from cache" in final and "first token" in final and "tok/s" in final
    assert f'<span class="rc-stats">{engine.info.model_id} · first token' in final  # who answered
    history = store.history(alice, conv.id)
    assert [m.role for m in history] == ["user", "assistant"] and history[1].request is not None
    stats = store.request_metrics([history[1].request])[history[1].request]
    assert stats.finish_reason in ("stop", "length") and stats.prompt_tokens > 10
    assert markup.shown(history[1].content) in final  # as the chat area shows it
    assert page.conversation(alice, conv.id).title == "What does list.append do?"  # named after it
    assert len(metrics.finals) == 1 and page.running == {}

    # the second turn restores the first from the prefix cache
    shown = reply(page, alice, conv.id, "And dict.get?", temperature=0, max_tokens=8)
    second = store.history(alice, conv.id)[-1]
    assert store.request_metrics([second.request])[second.request].cached_tokens >= stats.prompt_tokens
    assert stats.model == engine.info.model_id  # read back: a reload says who answered too
    assert all(engine.info.model_id in r["content"] for r in page.messages(alice, conv.id) if r["role"] == "assistant")
    assert len(shown[-1]) == 4


def test_stop_cancels_in_the_engine_and_keeps_the_text(engine, store, users):
    alice, _ = users
    page = ChatPage(engine, store)
    conv = page.new_chat(alice)

    async def scenario():
        gen = page.reply(alice, conv.id, "Tell me everything about generators.", temperature=0, max_tokens=450)
        shown = [await gen.__anext__()]
        with pytest.raises(PageError, match="still being written"):
            await collect(page.reply(alice, conv.id, "another"))
        while "▍" in shown[-1][-1]["content"] and len(shown) < 3:
            shown.append(await gen.__anext__())
        assert page.stop(alice, conv.id)
        shown += [s async for s in gen]
        return shown

    shown = asyncio.run(scenario())
    assert "stopped" in shown[-1][-1]["content"]
    deadline = time.time() + 5
    while engine.stats().inflight and time.time() < deadline:
        time.sleep(0.02)
    assert engine.stats().inflight == 0
    reply_msg = store.history(alice, conv.id)[-1]
    stats = store.request_metrics([reply_msg.request])[reply_msg.request]
    assert stats.finish_reason == "cancelled" and reply_msg.content
    assert markup.shown(reply_msg.content) in shown[-1][-1]["content"]
    assert page.stop(alice, conv.id) is False  # nothing running any more


def test_a_page_that_goes_away_mid_reply_still_stores_it(engine, store, users):
    alice, _ = users
    metrics = Counting()
    page = ChatPage(engine, store, metrics)
    conv = page.new_chat(alice)

    async def leave_early():
        gen = page.reply(alice, conv.id, "Explain dicts at length.", temperature=0, max_tokens=450)
        await gen.__anext__()
        await gen.__anext__()
        await gen.aclose()  # the browser went away

    asyncio.run(leave_early())
    deadline = time.time() + 10
    while len(store.history(alice, conv.id)) < 2 and time.time() < deadline:
        time.sleep(0.05)
    history = store.history(alice, conv.id)
    assert [m.role for m in history] == ["user", "assistant"]
    assert store.request_metrics([history[1].request])[history[1].request].finish_reason == "cancelled"
    assert engine.stats().inflight == 0
    assert len(metrics.finals) == 1


@pytest.mark.parametrize("held", ["append_reply", "append_message"])
def test_a_page_that_goes_away_while_storing_stores_the_reply_once(engine, store, users, monkeypatch, held):
    """Leaving while the reply (or the question before it) is being written: that write
    still commits, and nothing writes the reply, or counts the request, a second time."""
    alice, _ = users
    metrics = Counting()
    page = ChatPage(engine, store, metrics)
    conv = page.new_chat(alice)
    write = Held(monkeypatch, store, held)

    async def leave_during_the_write():
        task = asyncio.ensure_future(
            collect(page.reply(alice, conv.id, "What is a tuple?", temperature=0, max_tokens=4))
        )
        while not write.entered.is_set():
            await asyncio.sleep(0.005)
        task.cancel()  # the browser went away
        with pytest.raises(asyncio.CancelledError):
            await task
        write.go.set()

    asyncio.run(leave_during_the_write())
    deadline = time.time() + 10
    while time.time() < deadline and not (len(store.history(alice, conv.id)) >= 2 and write.returned == write.calls):
        time.sleep(0.02)
    time.sleep(0.2)  # room for a second write, were there one
    history = store.history(alice, conv.id)
    assert [m.role for m in history] == ["user", "assistant"]
    assert write.calls == 1 and len(metrics.finals) == 1
    assert engine.stats().inflight == 0 and page.running == {}


def test_a_message_reads_its_tab_once(engine, store, users, monkeypatch):
    """One read before the reply, none after: what is shown meanwhile and at the end is
    built from what the page holds. Thread hops: the read, the question, the reply (the chat
    template runs in the engine's own preparation pool, core.engine.prepare, not here)."""
    alice, _ = users
    page = ChatPage(engine, store, Counting())
    conv = page.new_chat(alice, "Be brief.")
    reply(page, alice, conv.id, "What is a set?", temperature=0, max_tokens=4)

    calls = Counter()
    for name in ("get_conversation", "branch", "request_metrics", "list_conversations"):

        def counted(*args, _real=getattr(store, name), _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(store, name, counted)
    real_submit = ThreadPoolExecutor.submit

    def hop(self, *args, **kwargs):  # asyncio.to_thread and the page's writes both come here
        calls["hops"] += 1
        return real_submit(self, *args, **kwargs)

    monkeypatch.setattr(ThreadPoolExecutor, "submit", hop)
    shown = reply(page, alice, conv.id, "And a frozenset?", temperature=0, max_tokens=4)
    assert dict(calls) == {"get_conversation": 1, "branch": 1, "request_metrics": 1, "hops": 3}
    calls.clear()
    again = reply(page, alice, conv.id, None, temperature=0, max_tokens=4, regenerate=True)
    assert dict(calls) == {"get_conversation": 1, "branch": 1, "request_metrics": 1, "hops": 2}
    monkeypatch.undo()
    # built from what it held, and the same as a fresh read
    assert len(shown[-1]) == 4 and "prompt tokens from cache" in shown[-1][-1]["content"]
    assert again[-1] == page.messages(alice, conv.id)
    assert shown[-1][:3] == again[-1][:3]


def test_regenerate_shows_the_newest_reply_and_keeps_the_old(engine, store, users):
    alice, _ = users
    page = ChatPage(engine, store)
    conv = page.new_chat(alice)
    reply(page, alice, conv.id, "What is a set?", temperature=0, max_tokens=6)
    shown = reply(page, alice, conv.id, None, temperature=1.5, max_tokens=6, regenerate=True)
    history = store.history(alice, conv.id)  # the branch in view: the newest answer
    assert [m.role for m in history] == ["user", "assistant"]
    assert store.branch(alice, conv.id).versions[history[1].id] == (history[1].id - 1, history[1].id)
    assert [m.id for m in visible_turns(history)] == [history[0].id, history[1].id]
    assert len(shown[-1]) == 2 and markup.shown(history[1].content) in shown[-1][1]["content"]
    assert "2/2" in shown[-1][1]["content"]  # and the way back to the first
    # the model sees only the newest reply: the next turn's prompt alternates roles
    reply(page, alice, conv.id, "Thanks.", temperature=0, max_tokens=4)
    assert [m["role"] for m in page.messages(alice, conv.id)] == ["user", "assistant"] * 2


def test_continue_goes_on_from_a_cut_answer_as_one_message(engine, store, users):
    """Continue after the length limit: the answer's text, then more, stored as one new version
    of the answer (the cut one stays); the model went on from the answer, not a new turn."""
    alice, _ = users
    page = ChatPage(engine, store)
    conv = page.new_chat(alice)
    reply(page, alice, conv.id, "What is a set?", temperature=0, max_tokens=6)
    cut = store.history(alice, conv.id)[-1]
    assert store.request_metrics([cut.request])[cut.request].finish_reason == "length"
    shown = reply(page, alice, conv.id, None, temperature=0, max_tokens=5, go_on=True)
    question, whole = store.history(alice, conv.id)
    assert whole.id != cut.id and whole.parent == question.id == cut.parent
    assert whole.content.startswith(cut.content.rstrip()) and len(whole.content) > len(cut.content.rstrip())
    assert store.branch(alice, conv.id).versions[whole.id] == (cut.id, whole.id)
    figures = store.request_metrics([whole.request])[whole.request]
    assert figures.cached_tokens > 0  # the question's prompt, from the cache
    # while it was written, the chat showed the cut text going on, never the answer twice
    assert all(markup.shown(cut.content.rstrip()) in rows[-1]["content"] for rows in shown)
    assert all(len(rows) == 2 for rows in shown)
    assert markup.shown(whole.content) in shown[-1][-1]["content"]
    # the next turn follows the whole answer
    reply(page, alice, conv.id, "Thanks.", temperature=0, max_tokens=4)
    assert store.history(alice, conv.id)[1].content == whole.content


def test_continue_needs_an_answer_with_text(engine, store, users):
    alice, _ = users
    page = ChatPage(engine, store)
    conv = page.new_chat(alice)
    with pytest.raises(PageError, match="no message to answer again"):
        reply(page, alice, None, None, go_on=True)
    store.append_message(alice, conv.id, "user", "What is a set?")
    with pytest.raises(PageError, match="no answer to continue"):
        reply(page, alice, conv.id, None, go_on=True)
    store.append_message(alice, conv.id, "assistant", "   ")
    with pytest.raises(PageError, match="no text to go on from"):
        reply(page, alice, conv.id, None, go_on=True)


def test_exporting_a_chat_with_no_message_says_there_is_nothing(store, users):
    alice, bob = users
    page = ChatPage(Refusing(QueueFull(1)), store)
    empty = page.new_chat(alice)
    for conv_id in (None, empty.id):
        with pytest.raises(PageError, match="nothing to export"):
            page.export(alice, conv_id, "md")
    store.append_message(alice, empty.id, "user", "What is a list?")
    name, text = page.export(alice, empty.id, "md")
    assert name.endswith(".md") and "What is a list?" in text
    with pytest.raises(PageError, match="no longer exists"):  # someone else's: as if none
        page.export(bob, empty.id, "md")


# ---- the Server tab ----


def test_dashboard_shows_aggregates_only(engine, store, users):
    alice, _ = users
    page = ChatPage(engine, store)
    conv = page.new_chat(alice)
    reply(page, alice, conv.id, "my private question about tuples", temperature=0, max_tokens=4)
    presence = Presence()
    presence.seen("alice")
    presence.seen("bob")
    d = dashboard(engine, store, presence)
    assert engine.loaded.model_id in d.summary and "Users signed in | 2" in d.summary
    budget = f"of {engine.kv_budget / 2**30:.1f} GiB"
    assert "Prefix cache" in d.summary and budget in d.summary
    assert "| Disk cache | off" in d.summary  # the session engine has no disk tier
    assert f"room for {engine.stats().batch_tokens:,} tokens of running sequences" in d.summary
    assert "tuples" not in d.summary and "alice" not in d.summary
    assert list(d.requests.columns) == ["time", "count", "series"] and d.requests["count"].sum() >= 1
    assert list(d.ttft.columns) == ["time", "ms", "series"] and len(d.ttft) >= 2
    assert Presence(window_s=0).count() == 0


def test_dashboard_usage_is_ones_own_beside_everyones(engine, store, users):
    alice, bob = users
    page = ChatPage(engine, store)
    for user, n in ((alice, 1), (bob, 2)):
        conv = page.new_chat(user)
        for i in range(n):
            reply(page, user, conv.id, f"question {i}", temperature=0, max_tokens=4)
    presence = Presence()
    presence.seen("alice")
    d = dashboard(engine, store, presence, you=alice)
    assert "Users signed in | 1 user (active in the last 5 minutes)" in d.summary
    assert "| Requests | 1 request (0 failed) | 3 requests (0 failed) |" in d.usage
    assert "alice" not in d.usage + d.summary and "bob" not in d.usage + d.summary
    assert set(d.ttft["series"]) == {"p50", "p95", "your p50"}
    assert abs((d.x_lim[1] - d.x_lim[0]) - 3600) <= 60  # the plots span the hour their titles say
    mine, everyone = store.usage(user=bob), store.usage()
    assert (mine.requests, everyone.requests) == (2, 3) and mine.ttft_p50_ms is not None
    assert store.usage(user=bob, now=time.time() + 7200).requests == 0
    assert sum(b.requests for b in store.stats(user=alice)) == 1


# ---- the serve command's banner ----


def test_serve_banner_names_lan_addresses_and_how_to_add_users():
    from radixchat.core.config import Settings

    lan = serve_banner(Settings(host="0.0.0.0", port=8123), 0, addresses=["192.168.1.20", "10.0.0.7"])
    text = "\n".join(lan)
    assert "http://192.168.1.20:8123" in text and "http://10.0.0.7:8123" in text
    assert "radixchat users add NAME" in text and "nobody can sign in" in text
    local = serve_banner(Settings(port=8123, no_auth=True), 0)
    assert local[0] == "radixchat: open http://127.0.0.1:8123" and "no sign-in" in local[1]
    assert "2 users can sign in" in serve_banner(Settings(), 2)[-1]


def test_one_reply_at_a_time_per_tab_even_when_sent_together(engine, store, users):
    alice, _ = users
    page = ChatPage(engine, store)
    conv = page.new_chat(alice)

    async def both():
        return await asyncio.gather(
            collect(page.reply(alice, conv.id, "first", temperature=0, max_tokens=8)),
            collect(page.reply(alice, conv.id, "second", temperature=0, max_tokens=8)),
            return_exceptions=True,
        )

    results = asyncio.run(both())
    assert sum(isinstance(r, PageError) for r in results) == 1
    assert [m.role for m in store.history(alice, conv.id)] == ["user", "assistant"]
    assert page.running == {} and engine.stats().inflight == 0


def test_a_message_to_a_new_chat_lands_in_a_new_chat(engine, store, users):
    """ "New chat" then at once a message: it starts a chat of its own (the user's empty one, if
    any), with the system prompt typed for it, never the chat that was in view before; two
    sent to new chats at once get a chat each."""
    alice, bob = users
    page = ChatPage(engine, store)
    before = page.new_chat(alice, "Be brief.")
    reply(page, alice, before.id, "first chat", temperature=0, max_tokens=4)
    empty = store.create_conversation(alice)
    told: list[int] = []
    shown = reply(
        page,
        alice,
        None,
        "Zebra-9 a new chat",
        temperature=0,
        max_tokens=4,
        system_prompt="Be kind.",
        started=told.append,
    )
    assert told == [empty.id]  # the empty one, not a new one beside it
    assert next(m.content for m in store.history(alice, empty.id)) == "Zebra-9 a new chat"
    assert "Zebra-9" in shown[-1][0]["content"]
    conv = page.conversation(alice, empty.id)
    assert conv.system_prompt == "Be kind." and conv.title == "Zebra-9 a new chat"
    assert next(m.content for m in store.history(alice, before.id)) == "first chat"
    assert len(store.history(alice, before.id)) == 2
    assert ChatPage(engine, store).start(alice) == empty.id  # and a reload opens it

    async def together():
        return await asyncio.gather(
            *(
                collect(page.reply(u, None, f"together {i}", temperature=0, max_tokens=4))
                for i, u in enumerate((alice, alice, bob))
            )
        )

    asyncio.run(together())
    made = [c for c in page.conversations(alice) if c.title.startswith("together")]
    assert len(made) == 2 and all(len(store.history(alice, c.id)) == 2 for c in made)
    assert [c.title for c in page.conversations(bob)] == ["together 2"]
    with pytest.raises(PageError, match="Type a message"):
        reply(page, alice, None, "  ")
    with pytest.raises(PageError, match="no message to answer"):
        reply(page, alice, None, None, regenerate=True)
    assert page.running == {} and engine.stats().inflight == 0


async def acting_midway(page, user, conv_id, act) -> tuple[list, float]:
    """A long reply, `act` done (in a worker thread) once it is streaming; what it showed, and
    the seconds from `act` to its end."""
    shown, t0 = [], None
    async for rows in page.reply(user, conv_id, "tell me a long story", temperature=0, max_tokens=4000):
        shown.append(rows)
        if len(shown) == 2:
            await asyncio.to_thread(act)
            t0 = time.monotonic()
    return shown, time.monotonic() - t0


def test_a_disabled_users_reply_stops_within_a_second(engine, store, users):
    _, bob = users
    live = LiveRequests(store, every_s=0.1)
    page = ChatPage(engine, store, live=live)
    conv = page.new_chat(bob)

    try:
        shown, took = asyncio.run(acting_midway(page, bob, conv.id, lambda: store.set_disabled("bob", True)))
    finally:
        live.stop()
        store.set_disabled("bob", False)
    assert took < 1.0 and "stopped" in shown[-1][-1]["content"], (took, shown[-1][-1])
    reply_msg = store.history(bob, conv.id)[-1]
    stats = store.request_metrics([reply_msg.request])[reply_msg.request]
    assert stats.finish_reason == "cancelled" and reply_msg.content


def test_deleting_a_chat_stops_its_reply(engine, store, users):
    alice, _ = users
    page = ChatPage(engine, store)
    conv = page.new_chat(alice)

    asyncio.run(acting_midway(page, alice, conv.id, lambda: page.delete(alice, conv.id)))
    assert page.running == {} and engine.stats().inflight == 0
    assert page.conversations(alice) == []
    page.undo_delete(alice, conv.id)  # back, with the question; the stopped reply had nowhere to go
    assert [m.role for m in store.history(alice, conv.id)] == ["user"]


def test_a_chat_made_for_a_later_send_is_never_handed_out_twice(store, users):
    """Scripted clients of the page (the load test's PageUser) make a chat, then send in it: two
    sessions of one user must not be given the same empty one."""
    alice, _ = users
    page = ChatPage(Refusing(QueueFull(1)), store)
    first, second = page.new_chat(alice, "Be brief.", reuse=False), page.new_chat(alice, reuse=False)
    assert first.id != second.id and first.system_prompt == "Be brief."


# ---- branches: edit and send again, answer again, show another version ----


class Prompts:
    """The engine, noting the messages of every request it is given: what the model saw."""

    def __init__(self, engine):
        self.engine, self.seen = engine, []
        self.info = engine.info

    async def asubmit(self, request):
        self.seen.append([(m.role, m.content) for m in request.messages])
        return await self.engine.asubmit(request)


def test_edit_branches_and_the_version_shown_is_what_the_model_sees_next(engine, store, users):
    alice, _bob = users
    model = Prompts(engine)
    page = ChatPage(model, store)
    conv = page.new_chat(alice, "Be brief.").id
    reply(page, alice, conv, "What is a set?", temperature=0, max_tokens=4)
    reply(page, alice, conv, "Ordered?", temperature=0, max_tokens=4)
    q1, a1, _q2, a2 = store.history(alice, conv)
    assert page.edit_text(alice, conv, q1.id) == "What is a set?"

    # the edit: the model sees the system prompt and the new text only
    shown = reply(page, alice, conv, "What is a frozenset?", edit=q1.id, temperature=0, max_tokens=4)[-1]
    assert model.seen[-1] == [("system", "Be brief."), ("user", "What is a frozenset?")]
    e1, f1 = store.history(alice, conv)
    assert e1.parent is None and f1.parent == e1.id
    assert len(shown) == 2 and "2/2" in shown[0]["content"] and f'href="#rc-show-{q1.id}"' in shown[0]["content"]
    assert shown == page.messages(alice, conv)  # built without reading back, the same as a fresh read
    assert page.conversation(alice, conv).title == "What is a set?"  # an edit does not rename

    # ‹ 1/2 ›: the first version with its own turns, and the next message goes on from there
    back = page.show_version(alice, conv, q1.id)
    assert [
        markup.shown(t) in r["content"] for t, r in zip(["What is a set?", a1.content, "Ordered?", a2.content], back)
    ] == [True] * 4
    assert "1/2" in back[0]["content"] and f"rc-show-{e1.id}" in back[0]["content"]
    reply(page, alice, conv, "And a dict?", temperature=0, max_tokens=4)
    assert model.seen[-1] == [
        ("system", "Be brief."),
        ("user", "What is a set?"),
        ("assistant", a1.content),
        ("user", "Ordered?"),
        ("assistant", a2.content),
        ("user", "And a dict?"),
    ]
    # the edited version is kept with its answer
    assert [m.content for m in store.history(alice, conv)][:5] == [
        "What is a set?",
        a1.content,
        "Ordered?",
        a2.content,
        "And a dict?",
    ]
    page.show_version(alice, conv, e1.id)
    assert [m.id for m in store.history(alice, conv)] == [e1.id, f1.id]

    # regenerate twice: three versions of the answer, the one shown is what the model sees next
    reply(page, alice, conv, None, regenerate=True, temperature=1.5, max_tokens=4)
    last = reply(page, alice, conv, None, regenerate=True, temperature=1.5, max_tokens=4)[-1]
    assert "3/3" in last[1]["content"] and model.seen[-1] == [("system", "Be brief."), ("user", "What is a frozenset?")]
    answers = store.branch(alice, conv).versions[store.history(alice, conv)[-1].id]
    assert answers[0] == f1.id and len(answers) == 3
    middle = page.show_version(alice, conv, answers[1])
    assert "2/3" in middle[1]["content"]
    chosen = store.history(alice, conv)[-1]
    assert chosen.id == answers[1]
    reply(page, alice, conv, "Why?", temperature=0, max_tokens=4)
    assert model.seen[-1][-2:] == [("assistant", chosen.content), ("user", "Why?")]


def test_branch_calls_on_another_users_messages_are_notices_and_change_nothing(engine, store, users):
    alice, bob = users
    page = ChatPage(Prompts(engine), store)
    mine = page.new_chat(alice).id
    reply(page, alice, mine, "Secret-4471 plans", temperature=0, max_tokens=4)
    q, a = store.history(alice, mine)
    theirs = page.new_chat(bob).id
    reply(page, bob, theirs, "bob's chat", temperature=0, max_tokens=4)
    before = (store.history(alice, mine), store.history(bob, theirs), store.totals()["messages"])
    for conv in (mine, theirs):  # alice's chat, or bob's naming alice's messages
        with pytest.raises(PageError) as e:
            page.show_version(bob, conv, q.id)
        assert "Secret" not in e.value.message
        with pytest.raises(PageError):
            page.edit_text(bob, conv, q.id)
        with pytest.raises(PageError):
            reply(page, bob, conv, "mine now", edit=q.id, temperature=0, max_tokens=4)
    with pytest.raises(PageError):
        page.edit_text(alice, mine, a.id)  # an answer is not the user's to edit
    with pytest.raises(PageError):
        reply(page, alice, mine, "rewrite", edit=a.id, temperature=0, max_tokens=4)
    with pytest.raises(PageError, match="nothing to change in a new chat"):
        page.show_version(alice, None, q.id)
    assert (store.history(alice, mine), store.history(bob, theirs), store.totals()["messages"]) == before


def test_a_new_chats_title_is_its_first_message_cut_at_a_word():
    from radixchat.webui.page.logic.replies import TITLE_CHARS, title_from

    long = "How do I reverse a list in Python without making a copy of it?"
    title = title_from(long)
    assert title == "How do I reverse a list in Python…" and len(title) <= TITLE_CHARS
    assert long.startswith(title[:-1]) and long[len(title) - 1] == " "  # it ends where a word does
    assert title_from("  two\nlines  ") == "two lines"
    one_word = "x" * (2 * TITLE_CHARS)
    assert title_from(one_word) == "x" * (TITLE_CHARS - 1) + "…"
