"""The sidebar of chats, end to end: a real server, Debian's Chromium.

alice at 1280 px (the sidebar beside the chat) and bob at 390 px (a drawer, closed until opened),
signed in at once. A first visit is a new chat that its first message starts and names; "New
chat" and at once a message: the message starts a new chat, never lands in the one before;
pressing "New chat" again and again makes no empty chats and copies no system prompt; the search
finds a chat by a word of a message and opens it; rename; the chat open survives a reload and
opens in another browser of the same user; delete, undo, delete again and it stays gone once
"Undo delete" has gone. On a phone the message box and Send are on screen without scrolling, and
nothing scrolls sideways, drawer open or closed. bob sees only his own chats, and, calling the
page's handlers the way the page does with alice's chat, neither reads nor renames nor deletes
it. Screenshots go to test-output/page-sidebar/.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixchat.core.store import NotFound, Store
from radixchat.webui.page.logic.chat_page import title_from
from radixchat.webui.page.ui.layout import UNDO_S
from tests.support.browser import PHONE, WIDE, Shots, alice_and_bob
from tests.support.clients import PageClient, signed_in
from tests.support.page import answered, ready, say, send, sign_in
from tests.support.server import CHEAP, page_server, stop_clean

pytestmark = pytest.mark.slow

SHOTS = Path(__file__).resolve().parent.parent / "test-output" / "page-sidebar"
LIST = "() => [...document.querySelectorAll('#conv-list label')].map(l => l.innerText.trim())"
SELECTED = "() => document.querySelector('#conv-list label.selected')?.innerText.trim() ?? null"
OPEN = "() => document.querySelector('#sidebar')?.classList.contains('open')"
# the second one's last word is only in its message: its title is cut before it
A = [
    "Alpaca-1171 what is a list?",
    "Anchor-2283 what is a tuple in Python, and a Quagga-5?",
    "Aspen-3391 what is a set?",
]
B = ["Bison-4405 what is a dict?", "Beacon-5519 what is a frozenset?"]


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    model = request.getfixturevalue("page_model")
    srv = page_server(model, tmp_path_factory.mktemp("page-sidebar"), "--max-tokens", "12", "--max-batch", "8")
    yield srv
    stop_clean(srv)


def fits(page) -> None:
    """Nothing scrolls sideways; the message box and Send are on screen without scrolling."""
    width, height = page.viewport_size["width"], page.viewport_size["height"]
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), page.evaluate(
        "[document.documentElement.scrollWidth, window.innerWidth]"
    )
    page.evaluate("window.scrollTo(0, 0)")
    for what in ("#message textarea", "#send"):
        box = page.locator(what).bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= width, (what, box)
        assert box["y"] >= 0 and box["y"] + box["height"] <= height, (what, box)


def drawer(page, opened: bool) -> None:
    """Open or close the sidebar with its own button, as a person would."""
    if page.evaluate(OPEN) != opened:
        page.locator("#sidebar .toggle-button").click()
    page.wait_for_function(f"({OPEN})() == {json.dumps(opened)}")
    page.wait_for_timeout(400)  # it slides


def listed(page) -> list[str]:
    return page.evaluate(LIST)


def chats(server, name: str) -> dict[str, list[str]]:
    """What the store holds for `name`: each chat's title -> its messages, newest chat first."""
    with Store(server.db, scrypt=CHEAP) as store:
        user = store.get_user(name)
        return {
            c.title: [m.content for m in store.history(user, c.id)]
            for c in store.list_conversations(user, archived=None)
        }


def test_sidebar_two_users_at_1280_and_390(server, browser):
    shot = Shots(SHOTS)
    outside: list[str] = []
    pages = alice_and_bob(browser, server, outside)
    alice, bob = pages["alice"], pages["bob"]
    try:
        for name, page in pages.items():
            sign_in(page, server.url, name)
        for page in pages.values():
            ready(page)
        # a first visit: a new chat, nothing listed; the sidebar beside the chat on a wide
        # screen, a closed drawer on a phone
        alice.wait_for_function(OPEN)
        bob.wait_for_timeout(800)
        assert not bob.evaluate(OPEN) and listed(alice) == []
        fits(bob)
        shot(alice, "alice-1280-first-visit")
        shot(bob, "bob-390-first-visit")

        # a first message starts a chat, named after it, listed and selected
        say(alice, A[0])
        say(bob, B[0])
        alice.wait_for_function(f"({SELECTED})() == {json.dumps(A[0])}")
        fits(bob)
        drawer(bob, True)
        assert listed(bob) == [B[0]]
        assert bob.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        shot(bob, "bob-390-drawer-open")
        drawer(bob, False)

        # "New chat", then at once a message: it starts a new chat, not one more turn of the last
        alice.locator("#new-chat").click()
        send(alice, A[1])
        answered(alice, A[1].split()[0])
        alice.wait_for_function(f"({LIST})().length == 2")
        assert listed(alice) == [title_from(A[1]), A[0]]
        assert alice.evaluate(SELECTED) == title_from(A[1])
        held = chats(server, "alice")
        assert held[title_from(A[1])][0] == A[1] and len(held[A[0]]) == 2
        shot(alice, "alice-1280-new-chat-then-send")

        # "New chat" starts clean (no system prompt of the chat before), and pressing it again and
        # again makes no empty chats
        alice.locator("#system textarea").fill("Answer in one word.")
        alice.locator("#system textarea").press("Tab")  # saved when the box is left
        alice.wait_for_function("document.querySelector('#preset input')?.value == 'Custom'")
        for _ in range(3):
            alice.locator("#new-chat").click()
        alice.wait_for_function(
            "document.querySelector('#system textarea').value == ''"
            " && !document.querySelector('#chat [data-testid=user]')"
        )
        alice.wait_for_timeout(500)
        assert len(chats(server, "alice")) == 2 and alice.evaluate(SELECTED) is None
        say(alice, A[2])
        alice.wait_for_function(f"({LIST})().length == 3")
        with Store(server.db, scrypt=CHEAP) as store:
            newest = store.list_conversations(store.get_user("alice"), archived=None)
            assert [c.system_prompt for c in newest] == ["", "Answer in one word.", ""]

        # the search finds a chat by a word that is only in its message, and opens it
        alice.locator("#search input, #search textarea").first.fill("quagga")
        alice.wait_for_function(f"({LIST})().length == 1")
        [label] = listed(alice)
        assert label.startswith(title_from(A[1]) + " — ") and "Quagga-5" in label, label
        assert alice.evaluate(SELECTED) is None  # the chat in view is not among what was found
        shot(alice, "alice-1280-search")
        alice.locator("#conv-list label").first.click()
        alice.wait_for_function(f"document.querySelector('#chat').innerText.includes({json.dumps(A[1])})")
        alice.locator("#search input, #search textarea").first.fill("")
        alice.wait_for_function(f"({LIST})().length == 3")

        # rename it
        alice.locator("#title textarea, #title input").first.fill("Tuples and quaggas")
        alice.locator("#rename").click()
        alice.wait_for_function(f"({LIST})().includes('Tuples and quaggas')")
        assert alice.evaluate(SELECTED) == "Tuples and quaggas"

        # the chat open survives a reload, and opens in another browser where alice signs in
        alice.reload()
        ready(alice)
        alice.wait_for_function(f"({SELECTED})() == 'Tuples and quaggas'")
        assert A[1] in alice.locator("#chat").inner_text()
        phone = browser.new_context(viewport=PHONE).new_page()
        sign_in(phone, server.url, "alice")
        ready(phone)
        phone.wait_for_function(f"document.querySelector('#chat').innerText.includes({json.dumps(A[1])})")
        fits(phone)
        shot(phone, "alice-390-other-browser")
        phone.context.close()

        # delete, with undo
        alice.locator("#delete").click()
        alice.wait_for_function(f"!({LIST})().includes('Tuples and quaggas')")
        assert alice.locator("#undo").is_visible() and alice.evaluate(SELECTED) is None
        assert "Quagga" not in alice.locator("#chat").inner_text()
        shot(alice, "alice-1280-deleted-undo")
        alice.locator("#undo").click()
        alice.wait_for_function(f"({SELECTED})() == 'Tuples and quaggas'")
        assert A[1] in alice.locator("#chat").inner_text() and not alice.locator("#undo").is_visible()
        alice.locator("#delete").click()
        alice.wait_for_function(f"!({LIST})().includes('Tuples and quaggas')")
        alice.wait_for_selector("#undo", state="hidden", timeout=(UNDO_S + 10) * 1000)
        assert "Tuples and quaggas" not in chats(server, "alice")
        alice.reload()
        ready(alice)
        alice.wait_for_function(f"({LIST})().length == 2")
        assert "Tuples and quaggas" not in listed(alice)
        shot(alice, "alice-1280-after-delete-reload")

        # bob on his phone: "New chat" in the drawer closes it; picking a chat closes it too
        drawer(bob, True)
        bob.locator("#new-chat").click()
        bob.wait_for_function(f"!({OPEN})()")
        bob.wait_for_timeout(400)  # it slides away
        say(bob, B[1])
        fits(bob)
        drawer(bob, True)
        bob.wait_for_function(f"({LIST})().length == 2")
        assert listed(bob) == [B[1], B[0]]
        shot(bob, "bob-390-two-chats")
        bob.locator("#conv-list label").nth(1).click()
        bob.wait_for_function(f"!({OPEN})()")
        bob.wait_for_timeout(400)  # it slides away
        bob.wait_for_function(f"document.querySelector('#chat').innerText.includes({json.dumps(B[0])})")
        fits(bob)
        shot(bob, "bob-390-picked")

        # the other width for each
        alice.set_viewport_size(PHONE)
        alice.wait_for_timeout(500)
        assert alice.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        shot(alice, "alice-390")
        bob.set_viewport_size(WIDE)
        bob.wait_for_timeout(500)
        shot(bob, "bob-1280")

        # neither sees the other's chats anywhere on the page
        for page, theirs in ((alice, B), (bob, A)):
            drawer(page, True)
            text = page.locator("body").inner_text()
            assert not [w for w in theirs if w.split()[0] in text], text
    finally:
        for page in pages.values():
            page.context.close()
    assert outside == [], f"the page fetched from elsewhere: {outside}"


def test_another_users_chat_through_the_page_handlers_is_not_found(server):
    """bob's page session, calling the page's handlers as the page does, names alice's chat: he
    reads nothing of it, and it is neither renamed, nor deleted, nor written in, nor given another model."""
    with Store(server.db, scrypt=CHEAP) as store:
        alice = store.get_user("alice")
        theirs = store.create_conversation(alice, "alice private")
        store.append_message(alice, theirs.id, "user", "Armadillo-6627 secret")
    bob = PageClient(signed_in(server.url, "bob"))
    r, event = bob.join("on_load", [None])
    assert bob.messages(event)[-1]["success"]
    calls = {
        "switch": [theirs.id, 1000, "", None],
        "rename_chat": [theirs.id, "bob was here", "", None],
        "delete_chat": [theirs.id, "", None],
        "export_md": [theirs.id],
        "share_tab": [theirs.id],
        "send_message": ["bob writes here", theirs.id, "", 1000, "", 0, 8, None, None],
        "respond": ["bob writes here", theirs.id, 0, 8, None],
        "model_picked": ["page-model", theirs.id, None],
    }
    for fn, data in calls.items():
        r, event = bob.join(fn, data)
        assert r.status_code == 200, (fn, r.text)
        text = json.dumps(bob.messages(event))
        assert "Armadillo" not in text and "secret" not in text and "alice private" not in text, (fn, text)
        assert "no longer exists" in text, (fn, text)  # a notice, the same as for no chat at all
    with Store(server.db, scrypt=CHEAP) as store:
        alice = store.get_user("alice")
        assert store.get_conversation(alice, theirs.id).title == "alice private"
        assert [m.content for m in store.history(alice, theirs.id)] == ["Armadillo-6627 secret"]
        assert store.get_conversation(alice, theirs.id).model is None
        assert store.share_token(alice, theirs.id) is None
        with pytest.raises(NotFound):
            store.get_conversation(store.get_user("bob"), theirs.id)
