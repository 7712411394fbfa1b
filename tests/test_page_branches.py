"""Branches on the page: edit a sent message and send it again, answer again,
and browse the versions with ‹ i/n ›; the version shown is what the model sees next.

A real server and Debian's Chromium (the helpers of test_page_browser.py), alice at 1280 px and
bob at 390 px, signed in at once, each in a chat of their own: "Edit" under a message puts its
text in the box, Send makes a new version with a new answer and "2/2" on the message; "‹" shows
the first version again with its own answer (a message's copy button copies its text, not the
controls); a message sent then goes on from that branch (the
store's tree says what it follows, and its request's prompt is the short branch's, not the long
edited one's); Regenerate twice gives "3/3" under the answer, browsed back to "1/3". bob, through
the page's own queue, naming alice's messages, gets a notice and changes nothing. Screenshots go
to test-output/page-branches/.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixchat.core.store import Store
from tests.support.browser import PHONE, WIDE, Shots, alice_and_bob
from tests.support.clients import PageClient, signed_in
from tests.support.page import DONE, LAST_BOT, ready, send, sign_in
from tests.support.server import CHEAP, page_server, stop_clean

pytestmark = pytest.mark.slow

SHOTS = Path(__file__).resolve().parent.parent / "test-output" / "page-branches"
FIRST = {"alice": "Alpaca-1181 what is a list?", "bob": "Bison-2291 what is a dict?"}
# the edited version is long, so that a prompt through it is told apart from one through the first
EDITED = {
    name: f"{text.split()[0]}-edited tell me " + "about sequences and their methods " * 12
    for name, text in FIRST.items()
}
NEXT = {"alice": "Anchor-3371 and a tuple?", "bob": "Beacon-4481 and a set?"}
BOTS = "document.querySelectorAll('#chat [data-testid=bot]').length"
USER_TEXTS = "() => [...document.querySelectorAll('#chat [data-testid=user]')].map(u => u.innerText)"


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    srv = page_server(
        tiny_model_dir, tmp_path_factory.mktemp("page-branches"), "--max-tokens", "12", "--max-batch", "8"
    )
    yield srv
    stop_clean(srv)


def settled(page, bots: int, mark: str, timeout: float = 60_000) -> None:
    """Wait until the chat shows `bots` answers, the last one finished and not being written,
    after a user message holding `mark`."""
    page.wait_for_function(
        f"""([mark, done]) => {{ const users = ({USER_TEXTS})();
              const last = ({LAST_BOT})();
              return {BOTS} == {bots} && users.some(u => u.includes(mark)) && last.includes(done)
                && !last.includes('▍'); }}""",
        arg=[mark, DONE],
        timeout=timeout,
    )
    page.wait_for_timeout(150)


def click_link(page, href: str) -> None:
    page.locator(f"#chat .rc-branch a[href='{href}']").first.click()


def counts(page, role: str) -> list[str]:
    """The "i/n" under each message of `role` ('user' or 'bot'), '' where there is none."""
    return page.evaluate(f"""() => [...document.querySelectorAll('#chat [data-testid={role}]')].map(
        m => m.querySelector('.rc-count')?.innerText.trim() || '')""")


def branch_of(server, name: str):
    """(history of the user's only chat, its branch), read from the store as it is now."""
    with Store(server.db, scrypt=CHEAP) as store:
        user = store.get_user(name)
        [conv] = store.list_conversations(user)
        return store.history(user, conv.id), store.branch(user, conv.id), conv.id


def prompt_tokens(server, request_id: int) -> int:
    with Store(server.db, scrypt=CHEAP) as store:
        return store.request_metrics([request_id])[request_id].prompt_tokens


def walk(page, server, name: str, shot) -> None:
    """The whole story in one user's page (its width is the page's own)."""
    px = page.viewport_size["width"]
    send(page, FIRST[name])
    settled(page, 1, FIRST[name].split()[0])
    [q1, a1], _, _conv = branch_of(server, name)
    assert counts(page, "user") == [""] and page.locator("#chat a[href^='#rc-show-']").count() == 0

    # Edit: the message's text goes into the box, and the bar says what Send will do
    click_link(page, f"#rc-edit-{q1.id}")
    page.wait_for_function("([t]) => document.querySelector('#message textarea').value == t", arg=[FIRST[name]])
    assert page.locator("#edit-bar").is_visible()
    shot(page, f"{name}-{px}-editing")
    box = page.locator("#message textarea")
    box.fill(EDITED[name])
    box.press("Enter")
    settled(page, 1, "-edited")
    page.wait_for_function(
        "!document.querySelector('#edit-bar') || !document.querySelector('#edit-bar').checkVisibility()"
    )
    assert counts(page, "user") == ["2/2"]
    assert FIRST[name] not in page.locator("#chat").inner_text()
    [e1, f1], branch, _ = branch_of(server, name)
    assert e1.content == EDITED[name] and e1.parent is None and branch.versions[e1.id] == (q1.id, e1.id)
    # the copy button copies the message, not the controls under it
    page.locator("#chat [data-testid=user]").first.hover()
    page.locator("#chat button[aria-label='Copy message']").first.click()
    assert page.evaluate("navigator.clipboard.readText()") == EDITED[name]
    shot(page, f"{name}-{px}-edited-2of2")

    # ‹ : the first version with its own answer again
    click_link(page, f"#rc-show-{q1.id}")
    page.wait_for_function(f"({USER_TEXTS})().length == 1 && ({USER_TEXTS})()[0].includes({FIRST[name]!r})")
    settled(page, 1, FIRST[name].split()[0])
    assert counts(page, "user") == ["1/2"]
    assert a1.content.strip().split("\n")[0][:20] in page.evaluate(LAST_BOT)
    assert "-edited" not in page.locator("#chat").inner_text()
    shot(page, f"{name}-{px}-first-version-1of2")

    # the next message goes on from the branch shown: after the first answer, with its prompt
    send(page, NEXT[name])
    settled(page, 2, NEXT[name].split()[0])
    history, _, _ = branch_of(server, name)
    assert [m.id for m in history[:2]] == [q1.id, a1.id] and history[2].content == NEXT[name]
    assert history[2].parent == a1.id and history[3].parent == history[2].id
    through_edit, through_first = prompt_tokens(server, f1.request), prompt_tokens(server, history[3].request)
    assert through_first < through_edit, (through_first, through_edit)  # the long edit was not in it
    shot(page, f"{name}-{px}-went-on-from-first")

    # Regenerate twice: three versions of the last answer, browsed back to the first
    first_answer = history[3].id
    for n in (2, 3):
        page.locator("#regenerate").click()
        page.wait_for_function(
            f"""() => [...document.querySelectorAll('#chat [data-testid=bot] .rc-count')]
                                   .some(c => c.innerText.trim() == '{n}/{n}')""",
            timeout=60_000,
        )
        settled(page, 2, NEXT[name].split()[0])
    assert counts(page, "bot") == ["", "3/3"]
    shot(page, f"{name}-{px}-regenerated-3of3")
    history, branch, _ = branch_of(server, name)
    answers = branch.versions[history[-1].id]
    assert len(answers) == 3 and answers[0] == first_answer and history[-1].id == answers[2]
    for want, target in (("2/3", answers[1]), ("1/3", answers[0])):
        click_link(page, f"#rc-show-{target}")
        page.wait_for_function(f"""() => [...document.querySelectorAll('#chat [data-testid=bot] .rc-count')]
                                   .some(c => c.innerText.trim() == '{want}')""")
        assert branch_of(server, name)[0][-1].id == target  # what the model sees next
    shot(page, f"{name}-{px}-browsed-1of3")

    # Continue: the answer in view goes on, as one message (a fourth version: the three stay)
    shown_before = history_text = branch_of(server, name)[0][-1].content.rstrip()
    page.locator("#continue").click()
    page.wait_for_function(
        """() => [...document.querySelectorAll('#chat [data-testid=bot] .rc-count')]
                                   .some(c => c.innerText.trim() == '4/4')""",
        timeout=60_000,
    )
    settled(page, 2, NEXT[name].split()[0])
    history, branch, _ = branch_of(server, name)
    assert history[-1].content.startswith(history_text) and len(history[-1].content) > len(history_text)
    assert branch.versions[history[-1].id][:3] == tuple(answers)
    assert shown_before[:20] in page.evaluate(LAST_BOT)
    shot(page, f"{name}-{px}-continued-4of4")
    if px < 500:  # a phone: the controls fit, nothing scrolls sideways
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def test_edit_regenerate_and_browse_versions_at_1280_and_390_px(browser, server):
    shot = Shots(SHOTS)
    outside: list[str] = []
    pages = alice_and_bob(browser, server, outside)
    try:
        for name, page in pages.items():
            page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)
            sign_in(page, server.url, name)
            ready(page)
        walk(pages["alice"], server, "alice", shot)
        walk(pages["bob"], server, "bob", shot)
        for name, other in (("alice", "bob"), ("bob", "alice")):
            text = pages[name].locator("body").inner_text()
            assert FIRST[other].split()[0] not in text and NEXT[other].split()[0] not in text
        # each at the other width: the same branch, the same controls
        pages["alice"].set_viewport_size(PHONE)
        pages["bob"].set_viewport_size(WIDE)
        for name, page in pages.items():
            page.wait_for_timeout(400)
            assert counts(page, "bot") == ["", "4/4"] and counts(page, "user") == ["1/2", ""]
            shot(page, f"{name}-other-width")
    finally:
        for page in pages.values():
            page.context.close()
    assert outside == [], f"the page fetched from elsewhere: {outside}"


def test_another_users_messages_through_the_page_handlers_are_not_found(server):
    """bob's page session calls the handler of ‹ › and Edit, as the page does, with alice's
    message ids, in her chat and in his own: a notice, nothing of hers, nothing changed."""
    with Store(server.db, scrypt=CHEAP) as store:
        alice, bob_user = store.get_user("alice"), store.get_user("bob")
        theirs = store.create_conversation(alice, "alice private")
        q = store.append_message(alice, theirs.id, "user", "Armadillo-6627 secret")
        old = store.edit_message(alice, theirs.id, q.id, "Armadillo-6627 edited secret")
        store.show_version(alice, theirs.id, q.id)
        mine = store.create_conversation(bob_user, "bob's own")
        store.append_message(bob_user, mine.id, "user", "bob's words")
    bob = PageClient(signed_in(server.url, "bob"))
    r, event = bob.join("on_load", [None])
    assert bob.messages(event)[-1]["success"]
    for conv in (theirs.id, mine.id):
        for asked in (f"show-{old.id}", f"edit-{q.id}"):
            r, event = bob.join("version_asked", [asked, conv, None])
            assert r.status_code == 200, r.text
            text = json.dumps(bob.messages(event))
            assert "Armadillo" not in text and "secret" not in text and "alice private" not in text, text
            assert "not in this chat" in text or "no longer exists" in text, text
    for junk in ("show-x", "drop-1", "", "show-99999999999999999999"):  # ignored, no error
        r, event = bob.join("version_asked", [junk, mine.id, None])
        assert r.status_code == 200 and "Traceback" not in json.dumps(bob.messages(event))
    with Store(server.db, scrypt=CHEAP) as store:
        alice = store.get_user("alice")
        assert [m.content for m in store.history(alice, theirs.id)] == ["Armadillo-6627 secret"]
        assert store.totals()["messages"] >= 3
