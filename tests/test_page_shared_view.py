"""A shared conversation's page as the chat shows it, and a signed-out visitor's way back to it.

A real server and Debian's Chromium, at 390 and 1280 px. alice's conversation (Markdown, a
code block, typed HTML, an image) is shared; bob, signed out, opens its link, signs in on the
sign-in page and lands on that link, which shows bold as bold, the code block as code, typed
HTML as typed and the image as a link, nothing fetched from elsewhere. `/?next=` sends a
signed-in browser only to a shared link's path on this server: another site
(`https://evil.example`, `//evil.example`, `/\\evil.example`) is never where it goes.
Screenshots go to test-output/page-shared-view/.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from radixchat.core.store import Store
from radixchat.webui.auth.gate import return_to
from tests.support.browser import PHONE, WIDE, Shots, context
from tests.support.clients import signed_in
from tests.support.server import CHEAP, PASSWORDS, page_server, stop_clean

SHOTS = Path(__file__).resolve().parent.parent / "test-output" / "page-shared-view"
QUESTION = "Why does **this** fail? <b>not bold</b>\n```python\nitems = [1, 2]\nitems.push(3)\n```"
ANSWER = "Lists have no `push`: use `append`.\n\n- one\n- two\n\n![a cat](http://elsewhere.example/cat.png)"
EVIL = ["https://evil.example", "//evil.example", "/\\evil.example", "https://evil.example/shared/abc", "/shared/../x"]


def test_return_to_lets_only_a_shared_links_path_through():
    assert return_to(["/shared/Abc_-123"]) == "/shared/Abc_-123"
    for bad in [*EVIL, "/", "/shared/", "/shared/a/b", "/shared/a?x=1", "javascript:alert(1)", "/shared/a\n"]:
        assert return_to([bad]) is None, bad
    assert return_to(["/shared/a", "/shared/b"]) is None  # given once, or not at all
    assert return_to([]) is None


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    srv = page_server(tiny_model_dir, tmp_path_factory.mktemp("shared-view"), "--max-tokens", "12")
    yield srv
    stop_clean(srv)


@pytest.fixture(scope="module")
def link(server) -> str:
    """The path of alice's shared conversation."""
    with Store(server.db, scrypt=CHEAP) as store:
        alice = store.get_user("alice")
        conv = store.create_conversation(alice, "Lists and push")
        store.append_message(alice, conv.id, "user", QUESTION)
        store.append_message(alice, conv.id, "assistant", ANSWER)
        return "/shared/" + store.share_conversation(alice, conv.id)


@pytest.mark.slow
@pytest.mark.parametrize("size", [PHONE, WIDE], ids=lambda s: f"{s['width']}px")
def test_signed_out_visitor_signs_in_and_reads_the_shared_chat_rendered(server, browser, link, size):
    shots = Shots(SHOTS / str(size["width"]))
    outside: list[str] = []
    ctx = context(browser, server, outside)
    try:
        page = ctx.new_page()
        page.set_viewport_size(size)
        page.goto(server.url + link)
        page.locator("input[type=password]").wait_for()
        assert page.url.endswith("/?next=" + link), page.url
        assert "Lists and push" not in page.content()
        shots(page, "sign-in")
        page.locator("input[type=text]").fill("bob")
        page.locator("input[type=password]").fill(PASSWORDS["bob"])
        page.get_by_role("button", name="Login").click()
        page.wait_for_url(server.url + link, timeout=30_000)
        page.wait_for_selector("#shared-messages")
        shots(page, "shared")

        text = page.locator("#shared-messages").inner_text()
        assert "```" not in text and "**" not in text, text
        assert page.locator("#shared-messages strong", has_text="this").count() == 1
        code = page.locator("#shared-messages pre code").inner_text()
        assert code == "items = [1, 2]\nitems.push(3)\n", code
        assert page.locator("#shared-messages li").count() == 2
        assert page.locator("#shared-messages code", has_text="append").count() == 1
        assert "<b>not bold</b>" in text  # typed HTML shows as typed
        assert page.locator("#shared-messages a[href='http://elsewhere.example/cat.png']").count() == 1
        assert page.locator("body :is(img, script:not([nonce]), iframe, b, svg, object, embed)").count() == 0
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
        assert page.evaluate("window.__csp || []") == []
        assert outside == [], outside
    finally:
        ctx.close()


@pytest.mark.slow
def test_next_never_sends_a_signed_in_browser_to_another_site(server, link):
    http = signed_in(server.url, "bob")
    try:
        back = http.get("/", params={"next": link}, follow_redirects=False)
        assert back.status_code == 303 and back.headers["location"] == link
        for bad in EVIL:
            r = http.get("/", params={"next": bad}, follow_redirects=False)
            assert r.status_code == 200, (bad, r.status_code, r.headers.get("location"))
            assert "location" not in r.headers
        twice = http.get(f"/?next={link}&next=https://evil.example", follow_redirects=False)
        assert twice.status_code == 200 and "location" not in twice.headers
    finally:
        http.close()
    # signed out: the sign-in page, which comes back to the same address once signed in
    out = httpx.get(server.url + "/", params={"next": link}, follow_redirects=False)
    assert out.status_code == 200 and "location" not in out.headers
    shared = httpx.get(server.url + link, follow_redirects=False)
    assert shared.status_code == 303 and shared.headers["location"].endswith("/?next=" + link)
