"""The page on a phone and on a desktop, as people use it without thinking.

A real server (a model with a long name, as real ones have) and Debian's Chromium. At 360, 390
and 414 px wide (and 1280) the header is one line, and the message box and Send are on screen
at load; on a phone the drawer holds the header's words in full. "Edit" under a sent message,
at 390 and 1280 px, puts its text into the box and brings the box and Send into view with the
caret in it, however long the chat above. Screenshots go to test-output/page-phone/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.browser import WIDE, Shots
from tests.support.page import ready, say, sign_in
from tests.support.randmodel import build_random_model
from tests.support.server import page_server, stop_clean

pytestmark = pytest.mark.slow

LAPTOP = {"width": 1280, "height": 800}  # a laptop's page: shorter than WIDE's

SHOTS = Path(__file__).resolve().parent.parent / "test-output" / "page-phone"
# phones people hold (the width) and how tall their browser's page is
SIZES = [{"width": 360, "height": 740}, {"width": 390, "height": 844}, {"width": 414, "height": 896}, WIDE, LAPTOP]
ONE_LINE_PX = 44  # a line of the header's text, or the Sign out button beside it, with room


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = build_random_model(tmp_path_factory.mktemp("phone") / "Llama-3.2-3B-Instruct-long-name-4bit-mlx")
    srv = page_server(model, tmp_path_factory.mktemp("phone-db"), "--max-tokens", "24")
    yield srv
    stop_clean(srv)


@pytest.fixture(scope="module")
def shots():
    return Shots(SHOTS)


def box_of(page, selector: str) -> dict:
    box = page.locator(selector).first.bounding_box()
    assert box is not None, f"{selector} is not shown"
    return box


def on_screen(page, selector: str) -> dict:
    """`selector`'s box, asserted to lie wholly inside the viewport."""
    box, size = box_of(page, selector), page.viewport_size
    assert box["y"] >= 0 and box["y"] + box["height"] <= size["height"], (selector, box, size)
    assert box["x"] >= 0 and box["x"] + box["width"] <= size["width"], (selector, box, size)
    return box


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s['width']}px")
def test_header_is_one_line_and_the_box_and_send_are_on_screen_at_load(server, browser, shots, size):
    page = browser.new_context(viewport=size).new_page()
    try:
        sign_in(page, server.url, "bob")
        ready(page)
        page.wait_for_timeout(500)  # the sidebar settles
        shots(page, f"load-{size['width']}x{size['height']}")
        assert box_of(page, "#top-row")["height"] <= ONE_LINE_PX, page.locator("#header").inner_text()
        on_screen(page, "#message textarea")
        on_screen(page, "#send")
        # what is done with the last answer, side by side, under the box
        regenerate, go_on = on_screen(page, "#regenerate"), on_screen(page, "#continue")
        assert regenerate["y"] == go_on["y"], (regenerate, go_on)
        # the header's one line shows who is signed in, however long the model's name after it
        name, line = page.evaluate(
            """() => [[...document.querySelectorAll('#header strong')].find(s => s.innerText == 'bob')
                        .getBoundingClientRect().right, document.querySelector('#header').getBoundingClientRect().right]"""
        )
        assert name <= line, (name, line)
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        if size["width"] <= 768:
            # closed, the drawer's controls are off-screen and out of the tab order (they were
            # tabbed to, at x -370 to -32)
            assert not page.locator("#new-chat").is_visible() and not page.locator("#search input").is_visible()
            # the drawer holds what the header's one line had no room for
            page.locator("#sidebar .toggle-button").click()
            page.wait_for_function("document.querySelector('#sidebar').classList.contains('open')")
            page.wait_for_timeout(400)  # it slides
            about = page.locator("#side-about")
            assert about.is_visible() and "bob signed in" in about.inner_text()
            assert "Llama-3.2-3B-Instruct-long-name-4bit-mlx" in about.inner_text()
            assert page.locator("#new-chat").is_visible()
            shots(page, f"drawer-{size['width']}")
    finally:
        page.context.close()


@pytest.mark.parametrize("size", [{"width": 390, "height": 844}, WIDE], ids=lambda s: f"{s['width']}px")
def test_edit_puts_the_text_in_the_box_and_keeps_box_and_send_on_screen(server, browser, shots, size):
    page = browser.new_context(viewport=size).new_page()
    try:
        sign_in(page, server.url, "alice" if size is WIDE else "bob")
        ready(page)
        mark = f"Walrus-{size['width']}"  # each width in a chat of its own
        for text in (f"{mark} tell me a long story about the sea and the ships on it", "Wombat and then?", "Weasel?"):
            say(page, text)
        edit = page.locator("#chat [data-testid=user]", has_text=mark).locator(".rc-branch a", has_text="Edit")
        edit.scroll_into_view_if_needed()
        edit.click()
        page.wait_for_function(f"document.querySelector('#message textarea')?.value.includes('{mark}')")
        page.wait_for_selector("#edit-bar", state="visible")
        page.wait_for_timeout(500)  # the box grows to its text
        shots(page, f"editing-{size['width']}")
        on_screen(page, "#message textarea")
        on_screen(page, "#send")
        on_screen(page, "#edit-bar")
        assert page.evaluate("document.activeElement === document.querySelector('#message textarea')")
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    finally:
        page.context.close()
