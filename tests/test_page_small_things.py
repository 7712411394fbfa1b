"""The small things that make the page feel broken when they go wrong, at 390 and 1280 px.

A real server and Debian's Chromium. A message's copy button copies its text as typed
(Markdown), an answer's without the figures under it, never the page's markup; a message's
label for screen readers is its words. Enter or Send on an empty box does nothing: no notice,
no message. A search that finds nothing says so, and the note goes once it finds something or
is cleared. Max tokens and temperature survive a reload, each user's their own. Screenshots go
to test-output/page-small/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from radixchat.core.store import Store
from tests.support.browser import PHONE, WIDE, Shots
from tests.support.page import ready, say, set_number, sign_in
from tests.support.server import CHEAP, page_server, stop_clean

pytestmark = pytest.mark.slow

SHOTS = Path(__file__).resolve().parent.parent / "test-output" / "page-small"
SIZES = {"390": PHONE, "1280": WIDE}
WHO = {"390": "bob", "1280": "alice"}
# what the page's Markdown safety turns into markup: inline code, escapes, HTML, an image
TYPED = "Copy-{w} what does `s[::-1]` do to <b>tags</b> & ![a cat](cat.png)?\n```python\nprint('<hi>')\n```"
CLIPBOARD = "navigator.clipboard.readText()"
TOASTS = "document.querySelectorAll('.toast-body').length"


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    srv = page_server(tiny_model_dir, tmp_path_factory.mktemp("small-db"), "--max-tokens", "24")
    yield srv
    stop_clean(srv)


@pytest.fixture(scope="module")
def shots():
    return Shots(SHOTS)


@pytest.fixture(params=sorted(SIZES), ids=lambda w: f"{w}px")
def page(request, browser, server):
    """A page signed in at one width (bob at 390 px, alice at 1280), allowed the clipboard."""
    width = request.param
    ctx = browser.new_context(viewport=SIZES[width])
    ctx.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)
    page = ctx.new_page()
    sign_in(page, server.url, WHO[width])
    ready(page)
    page.width = width
    yield page
    ctx.close()


def copy(page, role: str) -> str:
    """Press the copy button of the last message of `role` ("user", "bot": Gradio's names);
    what the clipboard then holds."""
    page.evaluate("navigator.clipboard.writeText('')")
    # Gradio puts a message's buttons in a row of their own, after the message's
    buttons = page.locator(f"#chat .message-row.{role}-row").last.locator(
        "xpath=following-sibling::div[contains(@class, 'message-buttons')][1]"
    )
    buttons.get_by_role("button", name="Copy message").click()
    page.wait_for_function(f"{CLIPBOARD}.then(t => t !== '')", polling=100)
    return page.evaluate(CLIPBOARD)


def test_copy_copies_the_text_as_typed(server, page, shots):
    typed = TYPED.format(w=page.width)
    say(page, typed)
    assert copy(page, "user") == typed
    shots(page, f"copied-{page.width}")
    copied = copy(page, "bot")
    with Store(server.db, scrypt=CHEAP) as store:
        user = store.get_user(WHO[page.width])
        conv = store.list_conversations(user)[0]
        answer = [m for m in store.history(user, conv.id) if m.role == "assistant"][-1]
    assert copied == answer.content
    assert "first token" not in copied and "rc-" not in copied
    labels = page.evaluate(
        "[...document.querySelectorAll('#chat [aria-label]')].map(e => e.getAttribute('aria-label'))"
    )
    assert f"user's message: {typed}" in labels, labels
    assert not [label for label in labels if "rc-" in label], labels


def test_an_empty_send_does_nothing(page, shots):
    say(page, f"Yak-{page.width} hello")
    sent = page.locator("#chat [data-testid=user]").count()
    box = page.locator("#message textarea")
    for _ in range(3):
        box.fill("   ")
        box.press("Enter")
        page.locator("#send").click()
    page.wait_for_timeout(1500)  # a notice would be up by now
    shots(page, f"empty-send-{page.width}")
    assert page.evaluate(TOASTS) == 0
    assert page.locator("#chat [data-testid=user]").count() == sent


def search(page, query: str) -> None:
    """Type in the sidebar's search (a phone opens its drawer first)."""
    if not page.evaluate("document.querySelector('#sidebar').classList.contains('open')"):
        page.locator("#sidebar .toggle-button").click()
        page.wait_for_function("document.querySelector('#sidebar').classList.contains('open')")
        page.wait_for_timeout(400)  # it slides
    page.locator("#search textarea, #search input").first.fill(query)


def test_a_search_that_finds_nothing_says_so(page, shots):
    say(page, f"Zebra-{page.width} stripes")
    search(page, "nothingmatchesthis")
    page.wait_for_function("document.querySelectorAll('#conv-list label').length == 0")
    page.locator("#search-none").wait_for(state="visible")
    assert "No chat matches" in page.locator("#search-none").inner_text()
    shots(page, f"search-nothing-{page.width}")
    search(page, f"Zebra-{page.width}")
    page.wait_for_function("document.querySelectorAll('#conv-list label').length == 1")
    assert not page.locator("#search-none").is_visible()
    search(page, "")
    page.wait_for_function("document.querySelectorAll('#conv-list label').length >= 1")
    assert not page.locator("#search-none").is_visible()


def test_settings_are_kept_per_user_across_a_reload(server, browser, page, shots):
    """Max tokens and temperature survive a reload, each user's their own (one browser, both)."""
    max_tokens, temperature = (33, 0.7) if page.width == "390" else (44, 1.1)
    set_number(page, "max-tokens", max_tokens)
    set_number(page, "temperature", temperature)
    page.wait_for_timeout(500)  # kept on input
    page.reload()
    ready(page)
    numbers = "[...['#max-tokens', '#temperature']].map(s => document.querySelector(s + ' input[type=number]').value)"
    page.wait_for_function(f"({numbers}).join() === '{max_tokens},{temperature}'", timeout=10_000)
    shots(page, f"settings-kept-{page.width}")
    # another user in the same browser has their own (the page's defaults here)
    page.goto(server.url + "/logout")
    sign_in(page, server.url, "bob" if WHO[page.width] == "alice" else "alice")
    ready(page)
    page.wait_for_timeout(1000)
    assert page.evaluate(numbers) != [str(max_tokens), str(temperature)]


def test_a_first_visit_says_where_the_chats_will_be(server, browser):
    """A new user's sidebar is not blank: it says where their chats will be, until there is one."""
    with Store(server.db, scrypt=CHEAP) as store:
        store.create_user("carol", "carol-password")
    page = browser.new_context(viewport=WIDE).new_page()
    try:
        page.goto(server.url)
        page.locator("input[type=text]").fill("carol")
        page.locator("input[type=password]").fill("carol-password")
        page.get_by_role("button", name="Login").click()
        ready(page)
        page.locator("#chats-none").wait_for(state="visible")
        assert "listed here" in page.locator("#chats-none").inner_text()
        # a new chat has nothing to export yet: pressing Export says so (no download, no silence)
        page.locator("#export-md").click()
        page.locator(".toast-body").first.wait_for(state="visible", timeout=10_000)
        assert "nothing to export" in page.locator(".toast-body").first.inner_text()
        say(page, "Yak-1 says hello")
        page.wait_for_function("document.querySelectorAll('#conv-list label').length == 1")
        assert not page.locator("#chats-none").is_visible()
    finally:
        page.context.close()


ANNOUNCED = """() => { window.__said = []; const seen = new WeakSet();
  const watch = () => document.querySelectorAll('[aria-live]').forEach(el => {
    if (seen.has(el) || el.closest('#chat')) return; seen.add(el);
    new MutationObserver(() => { const t = el.innerText.trim(); if (t) window.__said.push(t); })
      .observe(el, {childList: true, subtree: true, characterData: true}); });
  watch(); new MutationObserver(watch).observe(document.body, {childList: true, subtree: true}); }"""


def test_what_screen_readers_are_told_is_words_not_keys(page):
    """Gradio announces an event's end to screen readers; its English lacked the words, and
    "common.complete" was read out."""
    page.evaluate(ANNOUNCED)
    say(page, f"Heron-{page.width} says hello")
    page.evaluate("window.__said = []")
    page.locator("#rename").click()  # an event of the page's with Gradio's progress shown
    page.wait_for_function("window.__said.length > 0", timeout=15_000)  # after 5 s at most
    said = page.evaluate("window.__said")
    assert said and not any("common." in s for s in said), said  # "Done"


def test_a_code_blocks_copy_button_covers_none_of_its_code(page, shots):
    """On a phone a code block's copy button sat over its first line."""
    say(
        page,
        f"Ibis-{page.width} how do I print?\n```python\nprint('a long first line of code, longer than a phone is wide')\n```",
    )
    wrap = page.locator("#chat [data-testid=user]").last.locator(".code_wrap").first
    wrap.scroll_into_view_if_needed()
    shots(page, f"code-block-{page.width}")
    # the button's box against every box of the code's first line as laid out (it may wrap)
    button, line = page.evaluate(
        """(wrap) => { const b = wrap.querySelector('.copy_code_button').getBoundingClientRect();
            const code = wrap.querySelector('code'), r = document.createRange();
            const first = code.textContent.indexOf('\\n');
            const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
            let n, at = 0, start = null, end = null;
            while ((n = walker.nextNode())) {
              if (!start) start = [n, 0];
              if (at + n.length >= first) { end = [n, first - at]; break; }
              at += n.length; }
            r.setStart(...start); r.setEnd(...end);
            const box = (x) => ({left: x.left, right: x.right, top: x.top, bottom: x.bottom});
            return [box(b), [...r.getClientRects()].map(box)]; }""",
        wrap.element_handle(),
    )
    for part in line:
        apart = (
            part["right"] <= button["left"]
            or part["left"] >= button["right"]
            or part["bottom"] <= button["top"]
            or part["top"] >= button["bottom"]
        )
        assert apart, (button, part)
