"""The chat page as a user drives it in the browser (a Playwright page): sign in, wait for the
page, load it again, set a number, send, start a new chat, wait for an answer to finish; and the scripts that
read the last answer and the figures line under a finished one; and the replies the store
kept for a chat (`stored_replies`)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from tests.support.procs import scaled
from tests.support.server import PASSWORDS

# A reply to stop mid-stream: far longer than the page model writes before a loaded machine's
# browser gets to press Stop (at ~200 tokens a second it takes ~40 s; Stop comes after 2-4 s)
LONG_REPLY = 8000
PAGE_MODEL_CONTEXT = 8192

LAST_BOT = """() => { const b = [...document.querySelectorAll('#chat [data-testid=bot]')];
                      return b.length ? b[b.length - 1].innerText : ''; }"""
DONE = "prompt tokens from cache"  # the figures line under a finished answer


def sign_in(page, url: str, name: str) -> None:
    page.goto(url)
    page.locator("input[type=text]").fill(name)
    page.locator("input[type=password]").fill(PASSWORDS[name])
    page.get_by_role("button", name="Login").click()


def ready(page, timeout: float = 30_000) -> None:
    """Wait until the page after sign-in has loaded (its header names who is signed in)."""
    page.wait_for_function(
        "(document.querySelector('#header')?.innerText || '').includes(' signed in')", timeout=timeout
    )


def set_number(page, elem_id: str, value) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")
    page.wait_for_function(f"document.querySelector('#{elem_id} input[type=number]').value == '{value}'")


def send(page, text: str) -> None:
    box = page.locator("#message textarea")
    box.fill(text)
    box.press("Enter")


def new_chat(page) -> None:
    """ "New chat" in the sidebar (on a phone, its drawer opened first), and wait until the chat
    area is empty."""
    if not page.evaluate("document.querySelector('#sidebar').classList.contains('open')"):
        page.locator("#sidebar .toggle-button").click()
        page.wait_for_function("document.querySelector('#sidebar').classList.contains('open')")
        page.wait_for_timeout(400)  # it slides
    page.locator("#new-chat").click()
    page.wait_for_function("document.querySelector('#chat') && !document.querySelector('#chat [data-testid=user]')")


def answered(page, mark: str, timeout: float = 60_000) -> str:
    """Wait until the last answer, after the message holding `mark`, is finished; its text."""
    page.wait_for_function(
        """([mark, done]) => { const last = r => [...document.querySelectorAll(`#chat [data-testid=${r}]`)].pop();
             const q = last('user'), a = last('bot');
             return !!q && !!a && q.innerText.includes(mark) && a.innerText.includes(done)
               && !!(q.compareDocumentPosition(a) & Node.DOCUMENT_POSITION_FOLLOWING); }""",
        arg=[mark, DONE],
        timeout=timeout,
    )
    return page.evaluate(LAST_BOT)


def say(page, text: str, timeout: float = 60_000) -> str:
    """Send a message in the chat in view and wait for its answer to finish; its text."""
    send(page, text)
    return answered(page, text.split()[0], timeout)


def restarted(srv, model, *flags: str, while_down=None):
    """`srv` stopped cleanly and a new server started on the same port and database (the same
    origin, so the browser's storage and cookies apply to it); the new server. `while_down`,
    if given, is called between the two."""
    from unittest import mock

    from tests.support import server as servers

    servers.stop_clean(srv)
    if while_down is not None:
        while_down()
    with mock.patch.object(servers, "free_port", return_value=srv.port):
        again = servers.Server(model, srv.db, *flags)
    again.db = srv.db
    return again


def stored_replies(db: Path, mark: str, timeout: float = 30) -> list[tuple[str, str]]:
    """(text, finish reason) of each reply stored, oldest first, in the chat of the message
    holding `mark`, once there is one (at most `timeout` seconds, scaled to the machine's load)."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        with sqlite3.connect(db) as con:
            rows = con.execute(
                "SELECT m.content, r.finish_reason FROM messages m JOIN requests r ON r.id = m.request"
                " WHERE m.role = 'assistant' AND m.conversation ="
                " (SELECT conversation FROM messages WHERE role = 'user' AND content LIKE ?) ORDER BY m.id",
                (f"%{mark}%",),
            ).fetchall()
        if rows or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert rows, mark
    return rows
