"""Sign-in in the real browser (Chromium): the page's own sign-in gives the browser a device
cookie (HttpOnly, SameSite=Strict, a year long), and that browser signs in again, with the
page's form, while failures from other addresses keep alice's name locked out for everyone
else. The page's own "Sign out" works, and a page on another site can neither sign the
browser in as someone (an auto-submitted form to /login) nor sign it out (a navigation to
/logout): both are answered 403 and change nothing."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from radixchat.webui.auth.device_cookie import PREFIX
from tests.support.page import ready, sign_in
from tests.support.server import page_server, stop_clean
from tests.support.signin import fail_until_locked, from_address, login

pytestmark = pytest.mark.slow

EVIL = "http://evil.test"


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    srv = page_server(tiny_model_dir, tmp_path_factory.mktemp("page-signin"), "--max-tokens", "8")
    yield srv
    stop_clean(srv)


def signed_in_as(url: str, cookies: list[dict]) -> int:
    """The status of /config for these browser cookies: 200 signed in, 401 not."""
    jar = {c["name"]: c["value"] for c in cookies if url.startswith(f"http://{c['domain']}")}
    return httpx.get(url + "/config", cookies=jar, timeout=30).status_code


def test_the_browser_that_signed_in_before_signs_in_through_a_lockout_of_its_name(server, browser):
    ctx = browser.new_context()
    page = ctx.new_page()
    sign_in(page, server.url, "alice")
    ready(page)
    device = [c for c in ctx.cookies() if c["name"].startswith(PREFIX)]
    assert len(device) == 1, ctx.cookies()
    assert device[0]["httpOnly"] and device[0]["sameSite"] == "Strict", device
    assert device[0]["expires"] > time.time() + 300 * 86400, device

    page.get_by_role("link", name=re.compile("sign out", re.I)).click()  # the page's own
    page.wait_for_selector("input[type=password]", timeout=15_000)
    assert signed_in_as(server.url, ctx.cookies()) == 401

    fail_until_locked(server.url, "alice", "a-guess", range(20, 250), 8)
    with from_address(server.url, 3) as elsewhere:
        assert login(elsewhere, "alice", "alice-password").status_code == 429
    sign_in(page, server.url, "alice")  # the page's form, from the browser she used before
    ready(page)
    assert signed_in_as(server.url, ctx.cookies()) == 200
    with from_address(server.url, 3) as elsewhere:  # the lockout held all along
        assert login(elsewhere, "alice", "alice-password").status_code == 429
    ctx.close()


def test_another_site_can_neither_sign_the_browser_in_nor_out(server, browser):
    ctx = browser.new_context()
    pages = {
        "/login-csrf": f"""<form method=post action="{server.url}/login">
            <input name=username value=bob><input name=password value=bob-password></form>
            <script>document.forms[0].submit()</script>""",
        "/logout-csrf": f"""<script>location.href = "{server.url}/logout"</script>""",
    }
    ctx.route(
        f"{EVIL}/**", lambda route: route.fulfill(content_type="text/html", body=pages[route.request.url[len(EVIL) :]])
    )
    page = ctx.new_page()

    with page.expect_response(f"{server.url}/login") as answer:
        page.goto(f"{EVIL}/login-csrf")
    assert answer.value.status == 403, answer.value.text()
    assert "did not come from this server's page" in answer.value.text()
    assert signed_in_as(server.url, ctx.cookies()) == 401  # not signed in as bob

    sign_in(page, server.url, "bob")  # (alice's name may still be locked out by the test before)
    ready(page)
    with page.expect_response(f"{server.url}/logout") as answer:
        page.goto(f"{EVIL}/logout-csrf")
    assert answer.value.status == 403, answer.value.text()
    assert signed_in_as(server.url, ctx.cookies()) == 200  # still signed in
    page.goto(server.url)
    ready(page)
    ctx.close()
