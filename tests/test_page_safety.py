"""The page never loads anything from elsewhere, and signing out is a thing of the same tab.

A real server and Debian's Chromium (the fixtures and helpers of test_page_browser.py).

Content: a small HTTP listener on another loopback port records every request it gets. alice
sends a message holding HTML, a script, a markdown image and a link, all pointing at it, and a
reply holding the same and more (stored through the store: the test model writes no HTML) is
shown. The listener gets no request, no script runs, the HTML shows as typed, the image is a
link, code is code; the page's responses carry a Content-Security-Policy and every request
the browser makes goes to the server (or data:). Sign-out: alice in two tabs, bob in another
browser. Sign out in tab 1 lands on the sign-in page in that tab and ends the session on the
server; tab 2's next message brings the sign-in page, never "Error", and alice's chats are
gone from it; bob chats on. A tab whose cookie was removed does the same. Last, 200 random
mixes of Markdown's and HTML's marks, tags and images go through Gradio's own renderer: no
element that could fetch or run anything comes out. Screenshots at 1280 and 390 px go to
test-output/page-safety/.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from radixchat.core.store import Store
from tests.support.browser import PHONE, WIDE, Shots, context
from tests.support.page import new_chat, ready, say, send, sign_in
from tests.support.server import CHEAP, page_server, stop_clean

pytestmark = pytest.mark.slow

SHOTS = Path(__file__).resolve().parent.parent / "test-output" / "page-safety"
# a bare "Error" anywhere on the page, reported to the test even if the page goes away right after
ERRORS = """new MutationObserver(() => {
  const text = document.body ? document.body.innerText : '';
  if (/\\bError\\b/.test(text)) window.__sawError(text.slice(0, 300));
}).observe(document, {subtree: true, childList: true, characterData: true});"""
MESSAGE_PARTS = ":is(#chat [data-testid=bot], #chat [data-testid=user])"
FETCHERS = (
    "img, iframe, script, object, embed, video, audio, source, link, style, meta, form, input, "
    "svg:not(button svg), .mermaid, .latex-block"
)


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    srv = page_server(tiny_model_dir, tmp_path_factory.mktemp("page-safety"), "--max-tokens", "12")
    yield srv
    stop_clean(srv)


@pytest.fixture(scope="module")
def shots():
    return Shots(SHOTS)


def both_widths(page, shot, name: str) -> None:
    shot(page, f"{name}-1280")
    page.set_viewport_size(PHONE)
    page.wait_for_timeout(300)
    shot(page, f"{name}-390")
    page.set_viewport_size(WIDE)


def test_html_in_messages_and_replies_shows_as_typed_and_nothing_is_fetched(server, listener, browser, shots):
    leak = listener.url
    typed_img, typed_script = f'<img src="{leak}/a?leak=1">', "<script>window.__pwned=1</script>"
    message = f"Hostile-7781 {typed_img} {typed_script} and a picture ![x]({leak}/b) and [a link]({leak}/c)"
    reply = "\n".join(
        [
            f'Reply-8893 <img src="{leak}/r?leak=2"> <script>window.__pwned=2</script>',
            f'![y]({leak}/d) <iframe src="{leak}/e"></iframe>',
            f'`<img src="{leak}/f">` and ``<b>`` and <a href="{leak}/g" onclick="window.__pwned=3">x</a>',
            f'[d]: {leak}/h "a title',  # a definition whose title would run over the fence below
            "```",
            '"',
            f'<img src="{leak}/i">',
            "```",
            "```mermaid",
            f'graph TD; A["<img src={leak}/j>"]-->B',
            "```",
            f'$$<img src="{leak}/k">$$',
            f"[x](y`) ![z]({leak}/l) `",
            "```python",
            'if a < b and c & d: print("<ok>")',
            "```",
        ]
    )
    outside: list[str] = []
    ctx = context(browser, server, outside)
    page = ctx.new_page()
    try:
        first = page.goto(server.url)
        page.wait_for_selector("input[type=password]")
        both_widths(page, shots, "sign-in")
        sign_in_text = page.locator("body").inner_text()
        sign_in(page, server.url, "alice")
        ready(page)

        say(page, message)  # shown as it is sent, from the live path
        with Store(server.db, scrypt=CHEAP) as store:  # a reply that holds the same, from history
            alice = store.get_user("alice")
            conv = next(c for c in store.list_conversations(alice) if c.title.startswith("Hostile-7781"))
            store.append_message(alice, conv.id, "assistant", reply)
        page.reload()
        page.wait_for_function("document.querySelector('#chat')?.innerText.includes('Reply-8893')", timeout=30_000)
        page.wait_for_timeout(1500)  # anything the page would fetch, it has asked for by now
        chat = page.locator("#chat").inner_text()
        both_widths(page, shots, "hostile-chat")

        assert listener.hits == [], f"the page fetched from another host: {listener.hits}"
        assert page.evaluate("window.__pwned") is None
        assert typed_img in chat and typed_script in chat  # shown as typed, in the message
        assert f'Reply-8893 <img src="{leak}/r?leak=2"> <script>window.__pwned=2</script>' in chat
        assert f'<img src="{leak}/f">' in chat and f'<img src="{leak}/i">' in chat
        assert page.locator(f"{MESSAGE_PARTS} :is({FETCHERS})").count() == 0
        for path in ("/b", "/c", "/d"):  # the images are links to their address
            assert page.locator(f'#chat a[href="{leak}{path}"]').count() == 1, path
        code = page.locator("#chat pre code").all_inner_texts()
        assert 'if a < b and c & d: print("<ok>")' in "\n".join(code), code
        assert page.evaluate("window.__csp || []") == []

        # the Server tab's plots draw under the policy
        page.get_by_role("tab", name="Server").click()
        page.wait_for_function(
            "document.querySelectorAll('#requests-plot svg.marks, #ttft-plot svg.marks').length >= 2", timeout=20_000
        )
        assert page.evaluate("window.__csp || []") == []

        # every page response carries the policy; the sign-in page names the server and the model
        csp = first.headers.get("content-security-policy", "")
        assert "default-src 'self'" in csp and "http" not in csp, csp
        model = httpx.get(server.url + "/health").json()["model"]
        assert "radixchat" in sign_in_text and model in sign_in_text, sign_in_text
        for path in ("/", "/theme.css", "/config", "/gradio_api/info"):
            assert "content-security-policy" in httpx.get(server.url + path).headers, path
    finally:
        ctx.close()
    assert outside == [], f"the page fetched from elsewhere: {outside}"
    assert listener.hits == []


def signed_out_by(page, action) -> None:
    """`action` in a tab whose sign-in has ended, unless the tab's own periodic check showed it
    the sign-in page first; the sign-in page either way, within seconds."""
    try:
        action()
    except PlaywrightTimeout:  # the check won the race: nothing left to act on
        pass
    page.wait_for_selector("input[type=password]", timeout=15_000)


def test_sign_out_in_the_same_tab_and_a_signed_out_tab_shows_the_sign_in_page(server, browser, shots):
    outside: list[str] = []
    alice_ctx, bob_ctx = context(browser, server, outside), context(browser, server, outside)
    try:
        tab1 = alice_ctx.new_page()
        sign_in(tab1, server.url, "alice")
        ready(tab1)
        new_chat(tab1)  # the first test's long chat would leave no room in the test model's context
        say(tab1, "Alpaca-1171 what is a list?")
        tab2 = alice_ctx.new_page()  # the same browser: signed in already
        errors: list[str] = []
        tab2.expose_binding("__sawError", lambda source, text: errors.append(text))
        tab2.add_init_script(ERRORS)
        tab2.goto(server.url)
        tab2.wait_for_function("document.querySelector('#chat')?.innerText.includes('Alpaca-1171')", timeout=30_000)
        bob = bob_ctx.new_page()
        sign_in(bob, server.url, "bob")
        ready(bob)
        say(bob, "Bison-3391 what is a dict?")
        old_cookies = {c["name"]: c["value"] for c in alice_ctx.cookies()}
        assert httpx.get(server.url + "/config", cookies=old_cookies).status_code == 200

        # sign out in tab 1: this tab, the sign-in page, and the session is over on the server
        tab1.get_by_role("link", name=re.compile("sign out", re.I)).click()
        tab1.wait_for_selector("input[type=password]", timeout=15_000)
        assert len(alice_ctx.pages) == 2, [p.url for p in alice_ctx.pages]
        assert tab1.url.rstrip("/") == server.url
        assert "Alpaca-1171" not in tab1.locator("body").inner_text()
        assert httpx.get(server.url + "/config", cookies=old_cookies).status_code == 401
        shots(tab1, "signed-out-1280")

        # tab 2 shows the sign-in page at its next message, or sooner: a visible tab checks
        # with the server every few seconds (webui/page/events/sync.py)
        signed_out_by(tab2, lambda: send(tab2, "Anchor-2283 are you still there?"))
        tab2.wait_for_timeout(500)
        assert errors == [], errors
        assert "Alpaca-1171" not in tab2.locator("body").inner_text()
        both_widths(tab2, shots, "signed-out-elsewhere")

        # bob, in another browser, chats on
        say(bob, "Beacon-4405 what is a set?")
        assert "Bison-3391" in bob.locator("#chat").inner_text()

        # a tab whose cookie was removed: its next action brings the sign-in page too
        sign_in(tab1, server.url, "alice")
        ready(tab1)
        tab2.goto(server.url)
        ready(tab2)
        alice_ctx.clear_cookies()
        signed_out_by(tab2, lambda: tab2.locator("#new-chat").click(timeout=5_000))
        tab2.wait_for_timeout(500)
        assert errors == [], errors
        assert "Alpaca-1171" not in tab2.locator("body").inner_text()
        for page in (tab1, tab2, bob):
            assert page.evaluate("window.__csp || []") == []
    finally:
        alice_ctx.close()
        bob_ctx.close()
    assert outside == [], f"the page fetched from elsewhere: {outside}"


def hostile_texts(leak: str, n: int, seed: int = 7) -> list[str]:
    """Random texts of Markdown's and HTML's marks, and of tags and images pointing at `leak`."""
    marks = [
        "<",
        ">",
        "&",
        "`",
        "```",
        "~~~",
        "```mermaid",
        "\n",
        "\n\n",
        "  ",
        "    ",
        "\\",
        "!",
        "[",
        "]",
        "(",
        ")",
        ":",
        '"',
        "'",
        "|",
        "---",
        "*",
        "_",
        "~~",
        "#",
        "- ",
        "> ",
        "1. ",
        "a",
        "b c",
        "\t",
        "```py",
        "`` ` ``",
        "$$",
        "<!--",
        "-->",
        "&#60;",
        "\\`",
        "<code>",
        "</code>",
        f"![a]({leak}/i1)",
        f"[l]: {leak}/i2",
        f"<img src={leak}/i3>",
        "<script>window.__pwned=1</script>",
        f"<iframe src={leak}/i4>",
        f'<a href="{leak}/i5" onclick="window.__pwned=2">',
        "<svg onload=window.__pwned=3>",
        f"{leak}/i6",
        f'"{leak}/i7"',
    ]
    rng = random.Random(seed)
    return ["".join(rng.choice(marks) for _ in range(rng.randint(1, 40))) for _ in range(n)]


def test_random_hostile_text_through_the_real_renderer_fetches_nothing(server, listener, browser):
    """What markup.py makes of random mixes of marks, as Gradio's own marked and sanitizer render it."""
    listener.hits.clear()  # this test's own
    texts = hostile_texts(listener.url, 200)
    with Store(server.db, scrypt=CHEAP) as store:
        alice = store.get_user("alice")
        conv = store.create_conversation(alice, "Fuzz")
        for i, text in enumerate(texts):
            store.append_message(alice, conv.id, "user", f"U{i} {text}")
            store.append_message(alice, conv.id, "assistant", f"A{i} {text}")
    outside: list[str] = []
    ctx = context(browser, server, outside)
    page = ctx.new_page()
    try:
        sign_in(page, server.url, "alice")
        ready(page)
        page.locator("#conv-list label", has_text="Fuzz").click()
        page.wait_for_function(
            f"document.querySelectorAll('#chat [data-testid=bot]').length == {len(texts)}", timeout=60_000
        )
        page.wait_for_timeout(1500)
        assert listener.hits == [], listener.hits
        assert page.evaluate("window.__pwned") is None
        found = page.locator(f"{MESSAGE_PARTS} :is({FETCHERS})")
        assert found.count() == 0, [found.nth(i).evaluate("e => e.outerHTML") for i in range(min(5, found.count()))]
        assert page.evaluate("window.__csp || []") == []
    finally:
        ctx.close()
    assert outside == []
