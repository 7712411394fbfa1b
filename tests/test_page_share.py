"""Share a conversation on the LAN: a read-only link that other signed-in users here can open.

A real server and Debian's Chromium (the helpers of test_page_browser.py and
test_page_safety.py). alice sends a message holding HTML, a script and a markdown image that
point at a listener on another loopback port, and presses "Share": the page shows a link on
the server's own host. bob, signed in in another browser, opens it and reads the title and the
messages, the HTML as typed and the image as a link; nothing runs and the listener gets no
request. A signed-out browser is sent to the sign-in page and sees none of it. A wrong token
and, once alice pressed "Stop sharing", her old one are the same plain 404 "not found"; bob's
reload shows it.
Screenshots at 1280 and 390 px go to test-output/page-share/.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.browser import PHONE, WIDE, Shots, context
from tests.support.page import ready, say, sign_in
from tests.support.server import page_server, stop_clean

pytestmark = pytest.mark.slow

SHOTS = Path(__file__).resolve().parent.parent / "test-output" / "page-share"
LINK = "document.querySelector('#share-link input, #share-link textarea')?.value || ''"


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    srv = page_server(tiny_model_dir, tmp_path_factory.mktemp("page-share"), "--max-tokens", "12")
    yield srv
    stop_clean(srv)


def both_widths(page, shot, name: str) -> None:
    shot(page, f"{name}-1280")
    page.set_viewport_size(PHONE)
    page.wait_for_timeout(300)
    shot(page, f"{name}-390")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"] + 1, name
    page.set_viewport_size(WIDE)


def test_share_read_only_link_for_signed_in_users_then_revoke(server, listener, browser):
    shots = Shots(SHOTS)
    leak = listener.url
    typed_img, typed_script = f'<img src="{leak}/a?leak=1">', "<script>window.__pwned=1</script>"
    message = f"Sharing-4410 {typed_img} {typed_script} and ![x]({leak}/b) <b>bold?</b>"
    outside: list[str] = []
    alice_ctx, bob_ctx = context(browser, server, outside), context(browser, server, outside)
    anon_ctx = context(browser, server, outside)
    try:
        alice = alice_ctx.new_page()
        sign_in(alice, server.url, "alice")
        ready(alice)
        say(alice, message)
        alice.locator("#share").click()
        alice.wait_for_function(f"({LINK}).includes('/shared/')", timeout=20_000)
        link = alice.evaluate(LINK)
        assert link.startswith(server.url + "/shared/"), (link, server.url)
        token = link.rsplit("/", 1)[1]
        assert len(token) >= 32
        alice.locator("#share").click()  # sharing again: the same link
        alice.wait_for_timeout(1000)
        assert alice.evaluate(LINK) == link
        both_widths(alice, shots, "alice-shares")

        # bob, signed in, reads it: the title and the messages, HTML as typed
        bob = bob_ctx.new_page()
        sign_in(bob, server.url, "bob")
        ready(bob)
        opened = bob.goto(link)
        assert opened.status == 200
        assert "default-src 'self'" in opened.headers.get("content-security-policy", "")
        bob.wait_for_selector("#shared-messages")
        bob.wait_for_timeout(1000)
        title = bob.locator("#shared-title").inner_text()
        body = bob.locator("#shared-messages").inner_text()
        assert title.startswith("Sharing-4410"), title
        # rendered as the chat renders it: typed HTML as typed, the image as "!" and a link
        assert message.replace(f"![x]({leak}/b)", "!x") in body, body
        assert bob.locator(f"#shared-messages a[href='{leak}/b']").count() == 1
        assert bob.locator("#shared-messages [data-role=assistant]").count() == 1
        assert bob.locator("body :is(img, script:not([nonce]), iframe, b, svg, object, embed)").count() == 0
        assert bob.evaluate("window.__pwned") is None
        assert bob.evaluate("window.__csp || []") == []
        both_widths(bob, shots, "bob-reads")
        assert listener.hits == [], listener.hits

        # signed out: the sign-in page, none of the conversation
        anon = anon_ctx.new_page()
        anon.goto(link)
        anon.wait_for_selector("input[type=password]", timeout=30_000)
        assert "Sharing-4410" not in anon.content()
        both_widths(anon, shots, "signed-out")
        direct = httpx.get(link, follow_redirects=False)
        assert direct.status_code in (303, 401) and "Sharing-4410" not in direct.text

        # a wrong token: a plain 404
        wrong = bob.goto(server.url + "/shared/" + "A" * len(token))
        assert wrong.status == 404 and "not found" in bob.locator("body").inner_text()
        wrong_body = wrong.text()

        # alice stops sharing; bob's reload is the same "not found"
        alice.locator("#unshare").click()
        alice.wait_for_function(f"({LINK}) === ''", timeout=20_000)
        bob.goto(link)
        again = bob.reload()
        assert again.status == 404 and again.text() == wrong_body
        assert "Sharing-4410" not in bob.content()
        both_widths(bob, shots, "revoked")

        # sharing again makes a new link; the old one stays not found
        alice.locator("#share").click()
        alice.wait_for_function(f"({LINK}).includes('/shared/') && ({LINK}) !== {link!r}", timeout=20_000)
        assert bob.goto(link).status == 404
        assert bob.goto(alice.evaluate(LINK)).status == 200
    finally:
        for ctx in (alice_ctx, bob_ctx, anon_ctx):
            ctx.close()
    assert outside == [], f"a page fetched from elsewhere: {outside}"
    assert listener.hits == []
