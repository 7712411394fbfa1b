"""Typing on the page: drafts kept in the browser, the keyboard's shortcuts, and a tab that
follows what its user does in another.

A real server and Debian's Chromium, at 1280 and 390 px. A draft typed in a chat, and one in a
new chat, come back after a reload and after a server restart (the same port and database),
each in its own chat; another user signing in to the same browser sees neither; a sent
message's draft is gone. Esc stops a reply (stored as stopped in SQLite), but not from the
search box; Ctrl+Shift+O opens a new chat (and the button's title says so); Up in the empty
message box edits one's last message, and does nothing in a box with text. A chat made,
renamed or deleted in one tab shows so in another tab's sidebar without a reload, which keeps
its pick and its typed text; a reply begun in one tab streams in another that had its chat
open, and its title box follows a rename there unless it is being edited. A new user given
a removed user's name finds none of their drafts or settings. Screenshots go to test-output/page-drafts-keys/. Through the sync's handler, as the page
calls it: a tab is sent nothing when nothing changed, only its list when it did (never the
other user's), and is told once to follow a reply begun in its chat elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.browser import OUTPUT, PHONE, WIDE, Shots
from tests.support.page import (
    LAST_BOT,
    new_chat,
    ready,
    restarted,
    say,
    send,
    set_number,
    sign_in,
    stored_replies,
)
from tests.support.procs import scaled
from tests.support.randmodel import build_random_model
from tests.support.server import page_server, stop_clean
from webui.page.ui.shortcuts import SYNC_S

pytestmark = pytest.mark.slow

MAX_TOKENS = "600"  # a reply of many seconds on this model: it can be stopped and followed
BOX = "document.querySelector('#message textarea').value"
BUTTON = "document.querySelector('#send').innerText.trim()"
STREAMING = f"(({LAST_BOT})()).includes('▍')"
# (textContent: a phone's closed drawer is hidden, and innerText reads only what is shown)
CHATS = "[...document.querySelectorAll('#conv-list label')].map(l => l.textContent.trim())"
PICKED = "document.querySelector('#conv-list label.selected')?.textContent.trim() || ''"
DRAFTS = "Object.keys(localStorage).filter(k => k.startsWith('radixchat.draft.')).sort()"
USERS = {"1280": ("alice", WIDE), "390": ("bob", PHONE)}
RECONNECTING = "[...document.querySelectorAll('.toast-title')].some(t => t.innerText.trim() === 'Reconnecting')"
TOAST_TITLES = """() => new MutationObserver(() => document.querySelectorAll('.toast-title')
  .forEach(t => window.__toastTitle(t.innerText.trim()))).observe(document.body, {childList: true, subtree: true})"""


class Running:
    """The module's server, which a test may restart on the same port and database."""

    def __init__(self, model: Path, folder: Path):
        self.model = model
        self.srv = page_server(model, folder, "--max-tokens", MAX_TOKENS)

    @property
    def url(self) -> str:
        return self.srv.url

    @property
    def db(self) -> Path:
        return self.srv.db

    def restart(self, while_down=None) -> None:
        self.srv = restarted(self.srv, self.model, "--max-tokens", MAX_TOKENS, while_down=while_down)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # as the reply-outlives-tab tests': a reply of MAX_TOKENS runs for many seconds
    model = build_random_model(tmp_path_factory.mktemp("drafts") / "model", dim=512, layers=8, context=4096)
    running = Running(model, tmp_path_factory.mktemp("drafts-db"))
    yield running
    stop_clean(running.srv)


@pytest.fixture(scope="module")
def shots():
    return Shots(OUTPUT / "page-drafts-keys")


def opened(browser, server, name: str, size: dict):
    """`name`'s tab, signed in, at `size`, in a browser context of its own."""
    page = browser.new_context(viewport=size).new_page()
    sign_in(page, server.url, name)
    ready(page)
    return page


def box_reads(page, text: str, timeout: float = 10) -> None:
    page.wait_for_function(f"{BOX} === {text!r}", timeout=scaled(timeout) * 1e3)


def type_draft(page, text: str) -> None:
    """Type in the message box (not sent), and wait until the browser kept it."""
    box = page.locator("#message textarea")
    box.fill(text)
    page.wait_for_function(f"Object.values(localStorage).includes({text!r})", timeout=scaled(10) * 1e3)


def drawer_open(page) -> None:
    """On a phone, the sidebar's drawer opened (beside the chat on a wide screen it is open)."""
    if not page.evaluate("document.querySelector('#sidebar').classList.contains('open')"):
        page.locator("#sidebar .toggle-button").click()
        page.wait_for_function("document.querySelector('#sidebar').classList.contains('open')")
        page.wait_for_timeout(400)  # it slides


def drawer_closed(page) -> None:
    """On a phone, the drawer closed, for a screenshot of the chat under it."""
    page.wait_for_timeout(400)  # it may be sliding
    if page.evaluate("document.querySelector('#sidebar').classList.contains('open')"):
        page.locator("#sidebar .toggle-button").click()
        page.wait_for_timeout(400)


def pick(page, mark: str) -> None:
    """Open the chat whose title holds `mark`, and wait until it is in view."""
    drawer_open(page)
    page.locator("#conv-list label", has_text=mark).first.click()
    page.wait_for_function(
        f"({PICKED}).includes({mark!r}) && document.querySelector('#chat').innerText.includes({mark!r})",
        timeout=scaled(10) * 1e3,
    )


def short_replies(page) -> None:
    set_number(page, "max-tokens", 8)


def stored(db: Path, mark: str, timeout: float = 30) -> tuple[str, str]:
    """(text, finish reason) of the last reply stored in the chat of the message holding `mark`."""
    return stored_replies(db, mark, timeout)[-1]


def streams(page, timeout: float = 30) -> None:
    """The page shows a reply being written, and the button reads Stop."""
    page.wait_for_function(f"{STREAMING} && (({LAST_BOT})()).length > 5", timeout=scaled(timeout) * 1e3)
    page.wait_for_function(f"{BUTTON} === 'Stop'", timeout=scaled(10) * 1e3)


def stopped(page, timeout: float = 30) -> None:
    page.wait_for_function(f"(({LAST_BOT})()).includes('stopped')", timeout=scaled(timeout) * 1e3)
    page.wait_for_function(f"{BUTTON} === 'Send'", timeout=scaled(10) * 1e3)


# ---- drafts ----


@pytest.mark.parametrize("width", sorted(USERS), ids=lambda w: f"{w}px")
def test_drafts_survive_a_reload_and_a_restart_each_users_own_and_go_when_sent(browser, server, shots, width):
    name, size = USERS[width]
    other = "bob" if name == "alice" else "alice"
    mark = f"Draftchat-{width}"
    in_chat, in_new = f"half typed in the chat {width}", f"a new chat's first words {width}"
    page = opened(browser, server, name, size)
    try:
        short_replies(page)
        new_chat(page)
        say(page, f"{mark} what is a list?")
        type_draft(page, in_chat)
        page.reload()
        ready(page)
        box_reads(page, in_chat)  # the chat opens again, with its draft
        if size is PHONE:
            drawer_closed(page)
        shots(page, f"draft-after-reload-{width}")

        new_chat(page)
        box_reads(page, "")  # a new chat's box: the other chat's draft is that chat's
        type_draft(page, in_new)
        pick(page, mark)
        box_reads(page, in_chat)
        new_chat(page)
        box_reads(page, in_new)
        pick(page, mark)

        # while the server is away, the page says it is reconnecting (Gradio's toast said "Error"),
        # and once it is back the page loads itself again. The page learns the server is away at
        # its next call (a sync within SYNC_S), so the server stays down until it has: a restart
        # quicker than that was seen by no call, and nothing was shown (a CI run failed so)
        titles: list[str] = []
        page.expose_binding("__toastTitle", lambda source, text: titles.append(text))
        page.evaluate(TOAST_TITLES)
        with page.expect_navigation(timeout=scaled(90) * 1e3):
            server.restart(while_down=lambda: page.wait_for_function(RECONNECTING, timeout=scaled(3 * SYNC_S) * 1e3))
        ready(page)
        assert "Reconnecting" in titles and "Error" not in titles, titles
        box_reads(page, in_chat)
        new_chat(page)
        box_reads(page, in_new)
        if size is PHONE:
            drawer_closed(page)
        shots(page, f"draft-after-restart-{width}")

        # another user in the same browser: none of it
        page.goto(server.url + "/logout")
        sign_in(page, server.url, other)
        ready(page)
        page.wait_for_timeout(1000)
        assert page.evaluate(BOX) == ""
        new_chat(page)
        page.wait_for_timeout(500)
        assert page.evaluate(BOX) == ""
        shots(page, f"other-user-no-draft-{width}")
        page.goto(server.url + "/logout")
        sign_in(page, server.url, name)
        ready(page)
        box_reads(page, in_chat)

        # sent: its draft goes, the other chat's stays
        new_chat(page)
        box_reads(page, in_new)
        page.locator("#message textarea").press("Enter")
        page.wait_for_function(f"document.querySelector('#chat').innerText.includes({in_new!r})")
        page.wait_for_function(f"!Object.values(localStorage).includes({in_new!r})", timeout=scaled(30) * 1e3)
        page.reload()
        ready(page)
        box_reads(page, "")  # the sent message's chat is open: nothing kept for it
        pick(page, mark)
        box_reads(page, in_chat)
        assert not [k for k in page.evaluate(DRAFTS) if k.endswith(".new")]  # no new chat's draft left
    finally:
        page.context.close()


def test_a_new_user_given_a_removed_users_name_finds_none_of_their_drafts_or_settings(browser, server, shots):
    from radixchat.core.store import Store
    from tests.support.cheap import cheap_scrypt

    def sign_in_as_erin(page) -> None:
        page.goto(server.url)
        page.locator("input[type=text]").fill("erin")
        page.locator("input[type=password]").fill("erin-password")
        page.get_by_role("button", name="Login").click()
        ready(page)

    draft = "erin's half-typed secret 5521"
    with Store(server.db, scrypt=cheap_scrypt()) as store:
        store.create_user("erin", "erin-password")
    page = browser.new_context(viewport=WIDE).new_page()
    try:
        sign_in_as_erin(page)
        set_number(page, "max-tokens", 77)
        page.wait_for_function("Object.keys(localStorage).some(k => k.startsWith('radixchat.settings.'))")
        type_draft(page, draft)  # a new chat's draft
        with Store(server.db, scrypt=cheap_scrypt()) as store:
            store.remove_user("erin")  # an admin removes her; someone else is given her name
            store.create_user("erin", "erin-password")
        sign_in_as_erin(page)  # the old sign-in ended with her: the sign-in page
        page.wait_for_timeout(1500)  # the load has put back whatever it would
        assert page.evaluate(BOX) == ""
        assert page.locator("#max-tokens input[type=number]").input_value() == MAX_TOKENS
        assert draft in page.evaluate("Object.values(localStorage)")  # kept, under the old erin's key
        shots(page, "same-name-new-user-1280")
        type_draft(page, "the new erin's own words")
        page.reload()
        ready(page)
        box_reads(page, "the new erin's own words")  # hers are kept as anyone's are
    finally:
        page.context.close()


# ---- keys ----


def test_esc_stops_a_reply_but_not_from_the_search_box(browser, server, shots):
    mark = "Escape-7213"
    page = opened(browser, server, "alice", WIDE)
    try:
        set_number(page, "max-tokens", int(MAX_TOKENS))
        new_chat(page)
        send(page, f"{mark} tell me everything about generators")
        streams(page)
        page.locator("#search input, #search textarea").first.press("Escape")  # another field
        page.wait_for_timeout(1500)
        assert page.evaluate(STREAMING) and page.evaluate(BUTTON) == "Stop"
        page.locator("#message textarea").press("Escape")
        stopped(page)
        text, finish = stored(server.db, mark)
        assert finish == "cancelled" and text, (finish, text)
        shots(page, "esc-stopped-1280")
    finally:
        page.context.close()


@pytest.mark.parametrize("width", sorted(USERS), ids=lambda w: f"{w}px")
def test_ctrl_shift_o_opens_a_new_chat(browser, server, shots, width):
    name, size = USERS[width]
    mark = f"Shortcut-{width}"
    page = opened(browser, server, name, size)
    try:
        short_replies(page)
        new_chat(page)
        say(page, f"{mark} what is a set?")
        assert "Ctrl+Shift+O" in page.locator("#new-chat").get_attribute("title")
        page.locator("#message textarea").press("Control+Shift+O")
        page.wait_for_function("!document.querySelector('#chat [data-testid=user]')", timeout=scaled(10) * 1e3)
        page.wait_for_function("document.querySelector('#title textarea, #title input').value === ''")
        if size is PHONE:  # the drawer stays closed: the new chat is in view
            assert not page.evaluate("document.querySelector('#sidebar').classList.contains('open')")
        shots(page, f"new-chat-shortcut-{width}")
        say(page, f"{mark}-second what is a dict?")  # a message goes to a chat of its own
        drawer_open(page)
        page.wait_for_function(f"({CHATS}).filter(t => t.includes({mark!r})).length === 2")
    finally:
        page.context.close()


@pytest.mark.parametrize("width", sorted(USERS), ids=lambda w: f"{w}px")
def test_up_in_the_empty_box_edits_the_last_message(browser, server, shots, width):
    name, size = USERS[width]
    last = f"Uparrow-{width}-b and what is a tuple?"  # its own first word: `say` waits for its answer
    page = opened(browser, server, name, size)
    try:
        short_replies(page)
        new_chat(page)
        say(page, f"Uparrow-{width}-a what is a list?")
        say(page, last)
        box = page.locator("#message textarea")
        box.fill("not empty")
        box.press("ArrowUp")
        page.wait_for_timeout(1000)
        assert page.evaluate(BOX) == "not empty" and not page.locator("#edit-bar").is_visible()
        box.fill("")
        box.press("ArrowUp")
        box_reads(page, last)
        page.wait_for_function("!!document.querySelector('#edit-bar')?.offsetParent")
        shots(page, f"up-edits-{width}")
        page.locator("#message textarea").fill(f"Uparrow-{width}-c and what is a set?")
        page.locator("#message textarea").press("Enter")
        page.wait_for_function(
            "document.querySelector('#chat').innerText.includes('2/2')", timeout=scaled(60) * 1e3
        )  # a new version of the last message
    finally:
        page.context.close()


# ---- another tab ----


def test_the_sidebar_follows_chats_made_renamed_and_deleted_in_another_tab(browser, server, shots):
    page = opened(browser, server, "alice", WIDE)
    try:
        short_replies(page)
        new_chat(page)
        say(page, "Stays-3391 what is a list?")
        other = page.context.new_page()  # a second tab of hers, at a phone's width
        other.set_viewport_size(PHONE)
        other.goto(server.url)
        ready(other)
        other.wait_for_function(f"({PICKED}).includes('Stays-3391')")
        other.locator("#message textarea").fill("typing in the second tab")

        new_chat(page)
        say(page, "Madeelsewhere-4402 what is a dict?")
        other.wait_for_function(f"({CHATS}).some(t => t.includes('Madeelsewhere-4402'))", timeout=scaled(20) * 1e3)
        assert "Stays-3391" in other.evaluate(PICKED)  # its pick and its typing stay
        assert other.evaluate(BOX) == "typing in the second tab"
        drawer_open(other)
        shots(other, "made-elsewhere-390")

        page.locator("#title textarea, #title input").first.fill("Renamed-5513")
        page.locator("#rename").click()
        other.wait_for_function(f"({CHATS}).includes('Renamed-5513')", timeout=scaled(20) * 1e3)
        page.locator("#delete").click()
        other.wait_for_function(f"!({CHATS}).includes('Renamed-5513')", timeout=scaled(20) * 1e3)
        assert "Stays-3391" in other.evaluate(PICKED)
        assert other.evaluate(BOX) == "typing in the second tab"
        shots(other, "deleted-elsewhere-390")
        shots(page, "first-tab-1280")
    finally:
        page.context.close()


TITLE = "document.querySelector('#title textarea, #title input').value"


def test_the_open_chats_title_follows_a_rename_in_another_tab_unless_edited_here(browser, server, shots):
    page = opened(browser, server, "alice", WIDE)
    try:
        short_replies(page)
        new_chat(page)
        say(page, "Titled-6120 what is a set?")
        other = page.context.new_page()  # a second tab of hers, the same chat open
        other.goto(server.url)
        ready(other)
        other.wait_for_function(f"({PICKED}).includes('Titled-6120')")
        before = other.evaluate(TITLE)
        assert "Titled-6120" in before

        page.locator("#title textarea, #title input").first.fill("Renamed-7731")
        page.locator("#rename").click()
        other.wait_for_function(f"{TITLE} === 'Renamed-7731'", timeout=scaled(20) * 1e3)
        shots(other, "title-followed-1280")

        other.locator("#title textarea, #title input").first.fill("Being typed-8842")  # not renamed yet
        page.locator("#title textarea, #title input").first.fill("Renamed again-9953")
        page.locator("#rename").click()
        other.wait_for_function(f"({CHATS}).includes('Renamed again-9953')", timeout=scaled(20) * 1e3)
        other.wait_for_timeout(2 * 4000)  # two more syncs
        assert other.evaluate(TITLE) == "Being typed-8842"  # what is typed here stays
    finally:
        page.context.close()


def test_a_sync_follows_a_rename_made_elsewhere_unless_the_title_is_edited_here(tmp_path):
    import gradio as gr

    from radixchat.webui.page.events.view import View

    h, store, alice = sync_page(tmp_path)
    try:
        user, skip = store.get_user("alice"), gr.skip()
        conv = h.chat.new_chat(user)
        view = View()
        title = h.shown(user, conv.id, "", view, alice)[3]  # the chat comes into view
        h.chat.rename(user, conv.id, "Renamed elsewhere")
        assert h.synced("", conv.id, 0, title, view, alice)[2] == "Renamed elsewhere"
        assert h.synced("", conv.id, 0, "Renamed elsewhere", view, alice)[2] == skip  # once
        h.chat.rename(user, conv.id, "Renamed again")
        assert h.synced("", conv.id, 0, "Being typed", view, alice)[2] == skip  # edited here: kept
        assert h.synced("", conv.id, 0, "Renamed elsewhere", View(conv=conv.id), alice)[2] == skip  # shown nothing
        h.rename_chat(conv.id, "Being typed", "", view, alice)
        assert h.synced("", conv.id, 0, "Being typed", view, alice)[2] == skip  # its own rename
    finally:
        store.close()


def sync_page(tmp_path):
    """Handlers over a store with alice and bob and a fake engine; the store; alice's request."""
    from types import SimpleNamespace

    from radixchat.core.store import Store
    from radixchat.webui.page.events.handlers import Handlers
    from radixchat.webui.page.logic.chat_page import ChatPage
    from radixchat.webui.page.logic.dashboard import Presence
    from tests.support.cheap import cheap_scrypt
    from tests.support.fake_engine import FakeEngine

    store = Store(tmp_path / "page.db", scrypt=cheap_scrypt())
    for who in ("alice", "bob"):
        store.create_user(who, f"{who}-password")
    engine = FakeEngine("a fake reply")
    alice = SimpleNamespace(username="alice", headers={})
    return Handlers(ChatPage(engine, store), Presence(), {}, engine.info, sign_in=True), store, alice


def test_a_reply_begun_in_another_tab_streams_where_its_chat_is_open(browser, server, shots):
    mark = "Followed-6624"
    page = opened(browser, server, "alice", WIDE)
    try:
        short_replies(page)
        new_chat(page)
        say(page, f"{mark} what is a list?")
        other = page.context.new_page()
        other.goto(server.url)
        ready(other)
        other.wait_for_function(f"document.querySelector('#chat').innerText.includes({mark!r})")
        assert other.evaluate(BUTTON) == "Send"

        set_number(page, "max-tokens", int(MAX_TOKENS))
        send(page, f"{mark} now tell me everything about generators")
        streams(page)
        streams(other, timeout=30)  # without opening the chat again
        first = len(other.evaluate(LAST_BOT))
        other.wait_for_function(f"!({STREAMING}) || (({LAST_BOT})()).length > {first + 20}", timeout=scaled(30) * 1e3)
        assert other.evaluate(STREAMING), "the reply ended before it was seen growing"
        shots(other, "followed-elsewhere-1280")
        other.set_viewport_size(PHONE)
        drawer_closed(other)
        shots(other, "followed-elsewhere-390")
        other.locator("#message textarea").press("Escape")  # and Esc there stops it
        for tab in (other, page):
            stopped(tab)
        text, finish = stored(server.db, "now tell me everything")
        assert finish == "cancelled" and text, (finish, text)
    finally:
        page.context.close()


# ---- the sync's handler, as the page calls it ----


def test_a_sync_answers_only_what_changed(tmp_path):
    import asyncio
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    import gradio as gr

    from radixchat.core.store import Store
    from radixchat.webui.page.events.handlers import Handlers
    from radixchat.webui.page.events.view import View
    from radixchat.webui.page.logic.chat_page import ChatPage
    from radixchat.webui.page.logic.dashboard import Presence
    from tests.support.cheap import cheap_scrypt
    from tests.support.fake_engine import FakeEngine

    store = Store(tmp_path / "page.db", scrypt=cheap_scrypt())
    for who in ("alice", "bob"):
        store.create_user(who, f"{who}-password")
    engine = FakeEngine("a fake reply")
    h = Handlers(ChatPage(engine, store), Presence(), {}, engine.info, sign_in=True)
    alice, skip = SimpleNamespace(username="alice", headers={}), gr.skip()
    conv = h.chat.new_chat(store.get_user("alice"))
    store.append_message(store.get_user("alice"), conv.id, "user", "Hi-6")  # listed once it has one
    here, elsewhere = View(conv=conv.id), View(conv=conv.id)

    listed, bumped, titled = h.synced("", conv.id, 0, "", here, alice)
    # the first answer: the list, whose pick is the browser's
    assert listed.choices and bumped == skip and titled == skip
    assert listed.value is None or listed.value == conv.id
    assert h.synced("", conv.id, 0, "", here, alice) == (skip, skip, skip)  # nothing changed: nothing sent
    bobs = h.synced("", conv.id, 0, "", View(conv=conv.id), SimpleNamespace(username="bob", headers={}))
    assert bobs[0].choices == [] and bobs[1:] == (skip, skip)  # nothing of alice's for bob

    async def elsewhere_sends():
        engine.hold = True
        sender = h.send_message("Hi-7 there", conv.id, "", 0, "", 0, 16, None, elsewhere, alice)
        await sender.__anext__()  # its first rows: the reply is being written
        assert h.synced("", conv.id, 3, "", here, alice)[1] == 4  # the tab with the chat open follows it
        assert h.synced("", conv.id, 0, "", elsewhere, alice)[1] == skip  # the sender watches it already
        follower = h.follow_reply(conv.id, 0, "Send", here, alice)
        await follower.__anext__()
        await follower.__anext__()  # streaming here
        assert h.synced("", conv.id, 4, "", here, alice) == (skip, skip, skip)  # followed: nothing more
        engine.release()
        [_ async for _ in follower]
        [_ async for _ in sender]

    try:
        with ThreadPoolExecutor(1) as pool:  # Playwright's sync API may hold this thread's loop
            pool.submit(asyncio.run, elsewhere_sends()).result()
    finally:
        store.close()
