"""A page's reply is the server's, not the tab's: whatever the page does, it runs to its end
(or to Stop) and is stored whole.

In Chromium, against a real server: alice reloads her tab 1 s and 5 s into a reply, opens a
second tab mid-reply (at a phone's width), closes her tab and opens the page again; each
time the page that is left shows the reply so far, goes on streaming it, and ends with the
whole reply and the button reading Send, and the stored reply (read from SQLite) is complete
(not stopped) with the very text the page shows. Stop pressed in a second tab stops the
reply in both tabs, stored as stopped. Through the handlers, as the page calls them: a tab
whose stream is closed mid-reply leaves the reply running to its end; another user can
neither follow nor stop alice's reply. Screenshots at 1280 and 390 px go to
test-output/page-reply-outlives-tab/.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from radixchat.core.store import Store
from tests.support.browser import OUTPUT, PHONE, WIDE, Shots
from tests.support.cheap import cheap_scrypt
from tests.support.fake_engine import FakeEngine
from tests.support.page import DONE, LAST_BOT, new_chat, ready, send, sign_in, stored_replies
from tests.support.procs import scaled
from tests.support.randmodel import build_random_model
from tests.support.server import page_server, stop_clean

MAX_TOKENS = 900  # a reply of ~25 s on this model here (~37 tokens a second): it runs well past a reload
BUTTON = "document.querySelector('#send').innerText.trim()"
# the last answer's text as typed: its label for screen readers, which versions.LISTEN sets
# to the words the message's source comment holds (what its copy button copies)
LAST_SOURCE = """() => { const b = [...document.querySelectorAll('#chat [data-testid=bot]')].pop();
  const el = b && (b.matches('[aria-label]') ? b : b.querySelector('[aria-label]'));
  const t = el ? el.getAttribute('aria-label') : null;
  return t === null ? null : t.slice(t.indexOf(': ') + 2); }"""
STREAMING = f"(({LAST_BOT})()).includes('▍')"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    # wider and deeper than the page tests' model (~300 tokens a second here): a reply of
    # MAX_TOKENS runs for many seconds
    return build_random_model(tmp_path_factory.mktemp("outlives") / "model", dim=512, layers=8, context=4096)


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    srv = page_server(model, tmp_path_factory.mktemp("outlives-db"), "--max-tokens", str(MAX_TOKENS))
    yield srv
    stop_clean(srv)


@pytest.fixture(scope="module")
def shots():
    return Shots(OUTPUT / "page-reply-outlives-tab")


def stored(db: Path, mark: str, timeout: float = 30) -> tuple[str, str]:
    """(text, finish reason) of the reply stored after the message holding `mark`."""
    rows = stored_replies(db, mark, timeout)
    assert len(rows) == 1, rows
    return rows[0]


def opened(browser, server, size=WIDE):
    """alice's tab, signed in, at `size`."""
    context = browser.new_context(viewport=size)
    page = context.new_page()
    sign_in(page, server.url, "alice")
    ready(page)
    return page


def ask(page, mark: str) -> float:
    """Send a long question in a new chat; when its reply's first text showed (monotonic)."""
    new_chat(page)
    send(page, f"{mark} tell me everything about generators")
    page.wait_for_function(f"{STREAMING} && (({LAST_BOT})()).length > 5", timeout=scaled(30) * 1e3)
    return time.monotonic()


def follows(page, mark: str, timeout: float = 30) -> int:
    """The page (just opened) shows the reply to `mark` being written, Stop, and the text growing;
    how long the text was when first seen."""
    page.wait_for_function(
        f"document.querySelector('#chat').innerText.includes({mark!r}) && {STREAMING}", timeout=scaled(timeout) * 1e3
    )
    page.wait_for_function(f"{BUTTON} === 'Stop'", timeout=scaled(10) * 1e3)
    first = len(page.evaluate(LAST_BOT))
    page.wait_for_function(f"!({STREAMING}) || (({LAST_BOT})()).length > {first + 20}", timeout=scaled(timeout) * 1e3)
    assert page.evaluate(STREAMING), "the reply ended before it was seen growing: a longer reply is needed"
    return first


def ends_whole(page, server, mark: str, timeout: float = 180) -> str:
    """Wait for the reply's end on `page`: its figures, not stopped, the button reading Send; the
    stored reply is complete and is the text the page shows. That text."""
    page.wait_for_function(f"(({LAST_BOT})()).includes({DONE!r})", timeout=scaled(timeout) * 1e3)
    page.wait_for_function(f"{BUTTON} === 'Send'", timeout=scaled(10) * 1e3)
    shown = page.evaluate(LAST_BOT)
    assert "stopped" not in shown.split("\n")[-1], shown[-200:]
    text, finish = stored(server.db, mark)
    assert finish in ("stop", "length"), finish
    assert page.evaluate(LAST_SOURCE) == text  # the page shows the reply as stored
    return text


@pytest.mark.slow
@pytest.mark.parametrize("after", [1, 5], ids=["1s", "5s"])
def test_a_reload_mid_reply_streams_on_and_the_reply_is_stored_whole(browser, server, shots, after):
    mark = f"Reload-{after}s-4471"
    page = opened(browser, server)
    try:
        began = ask(page, mark)
        time.sleep(max(0.0, began + after - time.monotonic()))
        assert page.evaluate(STREAMING), "the reply ended before the reload: a longer reply is needed"
        before = len(page.evaluate(LAST_BOT))
        page.reload()
        ready(page)
        first = follows(page, mark)
        print(f"reload at {after} s: {before} characters before, {first} after the reload")
        shots(page, f"reload-{after}s-streaming-1280")
        page.set_viewport_size(PHONE)
        shots(page, f"reload-{after}s-streaming-390")
        page.set_viewport_size(WIDE)
        ends_whole(page, server, mark)
        shots(page, f"reload-{after}s-ended-1280")
    finally:
        page.context.close()


@pytest.mark.slow
def test_a_second_tab_opened_mid_reply_streams_it_to_its_end(browser, server, shots):
    mark = "Second-tab-5582"
    page = opened(browser, server)
    try:
        ask(page, mark)
        other = page.context.new_page()  # the same browser, a second tab, at a phone's width
        other.set_viewport_size(PHONE)
        other.goto(server.url)
        ready(other)
        follows(other, mark)
        shots(other, "second-tab-streaming-390")
        shots(page, "first-tab-streaming-1280")
        text = ends_whole(other, server, mark)
        assert ends_whole(page, server, mark) == text
        assert other.evaluate(LAST_BOT) == page.evaluate(LAST_BOT)
        shots(other, "second-tab-ended-390")
        shots(page, "first-tab-ended-1280")
    finally:
        page.context.close()


@pytest.mark.slow
def test_a_tab_closed_mid_reply_and_opened_again_finds_it_going_on(browser, server, shots):
    mark = "Closed-tab-6693"
    page = opened(browser, server)
    context = page.context
    try:
        ask(page, mark)
        time.sleep(2)
        page.close()
        time.sleep(1)
        again = context.new_page()
        again.goto(server.url)
        ready(again)
        follows(again, mark)
        shots(again, "reopened-streaming-1280")
        ends_whole(again, server, mark)
        again.set_viewport_size(PHONE)
        shots(again, "reopened-ended-390")
    finally:
        context.close()


@pytest.mark.slow
def test_stop_in_a_second_tab_stops_the_reply_in_both(browser, server, shots):
    mark = "Stop-elsewhere-7704"
    page = opened(browser, server)
    try:
        ask(page, mark)
        other = page.context.new_page()
        other.set_viewport_size(PHONE)
        other.goto(server.url)
        ready(other)
        follows(other, mark)
        other.locator("#send").click()  # it reads Stop
        for tab in (other, page):
            tab.wait_for_function(f"(({LAST_BOT})()).includes('stopped')", timeout=scaled(30) * 1e3)
            tab.wait_for_function(f"{BUTTON} === 'Send'", timeout=scaled(10) * 1e3)
        text, finish = stored(server.db, mark)
        assert finish == "cancelled" and text, (finish, text)
        assert other.evaluate(LAST_SOURCE) == page.evaluate(LAST_SOURCE) == text
        shots(other, "stopped-from-second-tab-390")
        shots(page, "stopped-first-tab-1280")
    finally:
        page.context.close()


# ---- through the handlers, as the page calls them ----


def as_user(name: str):
    return SimpleNamespace(username=name, headers={})


def run_apart(scenario):
    """asyncio.run in a thread of its own: Playwright's sync API may hold this thread's loop."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, scenario).result()


@pytest.fixture
def handlers(tmp_path):
    from radixchat.webui.page.events.handlers import Handlers
    from radixchat.webui.page.logic.chat_page import ChatPage
    from radixchat.webui.page.logic.dashboard import Presence

    store = Store(tmp_path / "page.db", scrypt=cheap_scrypt())
    for name in ("alice", "bob"):
        store.create_user(name, f"{name}-password")
    engine = FakeEngine("a fake reply of several words")
    page = ChatPage(engine, store)
    yield Handlers(page, Presence(), {}, engine.info, sign_in=True), engine, store
    store.close()


def test_another_user_can_neither_follow_nor_stop_a_reply(handlers):
    from radixchat.webui.page.events.view import STOP, View

    h, engine, store = handlers
    engine.hold = True  # the reply is written until release()
    alice, bob = store.get_user("alice"), store.get_user("bob")
    conv = h.chat.new_chat(alice)

    async def scenario():
        views = {"alice": View(conv=conv.id), "bob": View(conv=conv.id)}
        sender = h.send_message("Heron-1 hi", conv.id, "", 0, "", 0, 64, None, views["alice"], as_user("alice"))
        await sender.__anext__()  # its first rows: the reply is being written
        await sender.aclose()  # and the tab went away
        assert h.chat.writing(alice, conv.id)
        theirs = [out async for out in h.follow_reply(conv.id, 0, STOP, views["bob"], as_user("bob"))]
        assert h.stop_pressed(STOP, conv.id, as_user("bob")).value == "Send"  # nothing of bob's to stop
        assert h.chat.writing(alice, conv.id) and engine.cancelled == []
        follower = h.follow_reply(conv.id, 0, "Send", views["alice"], as_user("alice"))
        await follower.__anext__()  # nothing yet
        rows, button = await follower.__anext__()
        engine.release()
        rest = [out async for out in follower]
        return theirs, rows, button, rest

    theirs, rows, button, rest = run_apart(scenario())
    assert all("Heron" not in str(out) for out in theirs), theirs
    assert "Heron-1" in rows[0]["content"] and rows[-1]["content"].endswith("▍") and button.value == STOP
    assert "a fake reply of several words" in rest[0][0][-1]["content"]
    assert rest[-1][1].value == "Send"
    [_, answer] = store.history(alice, conv.id)
    assert answer.content == "a fake reply of several words"
    assert store.request_metrics([answer.request])[answer.request].finish_reason == "stop"
    assert store.list_conversations(bob) == []


def test_a_tab_that_leaves_mid_reply_leaves_it_running_to_its_end(engine, store):
    from radixchat.webui.page.logic.chat_page import ChatPage

    alice = store.create_user("alice", "alice-password")
    page = ChatPage(engine, store)
    conv = page.new_chat(alice)

    async def leave_early():
        gen = page.reply(alice, conv.id, "Explain dicts at length.", temperature=0, max_tokens=60)
        await gen.__anext__()
        await gen.__anext__()
        await gen.aclose()  # the browser went away
        while page.running:  # the reply goes on, on the server's loop
            await asyncio.sleep(0.02)

    run_apart(leave_early())
    history = store.history(alice, conv.id)
    assert [m.role for m in history] == ["user", "assistant"]
    assert store.request_metrics([history[1].request])[history[1].request].finish_reason in ("stop", "length")
