"""The page end to end: a real server, Chromium through Playwright, two users at once.

alice and bob sign in from two browser contexts, each starts two chats ("New chat") and chats
in both; replies stream; alice stops one mid-stream and the engine has nothing left running; a
reload keeps every chat and message; neither ever sees the other's chats or text; nothing is
fetched from anywhere but the server. Screenshots of each step go to test-output/page/.
Debian's Chromium, never `playwright install` (see DESIGN.md).
"""

from __future__ import annotations

import re
import time

import httpx
import pytest

from tests.support.browser import ARGS, CHROMIUM, SHOTS, Shots
from tests.support.page import (
    DONE,
    LAST_BOT,
    LONG_REPLY,
    PAGE_MODEL_CONTEXT,
    new_chat,
    ready,
    send,
    set_number,
    sign_in,
)
from tests.support.server import page_server, stop_clean

pytestmark = pytest.mark.slow

# markers no random model will write by chance, to tell whose text is on a page
WORDS = {
    "alice": ["Alpaca-1171 what is a list?", "Anchor-2283 what does a tuple hold?"],
    "bob": ["Bison-3391 what is a dict?", "Beacon-4405 what is a set?"],
}
LONG = "Arrow-5519 tell me everything about generators"
CODE = "Aspen-6627 why does **this** fail?\n```python\nitems = [1, 2]\nitems.push(3)\n```"

CHATS = "() => [...document.querySelectorAll('#conv-list label')].map(l => l.innerText.trim())"  # newest first


@pytest.fixture(scope="module")
def server(page_model, tmp_path_factory):
    srv = page_server(page_model, tmp_path_factory.mktemp("page-db"), "--max-tokens", "200", "--max-batch", "8")
    yield srv
    stop_clean(srv)


RECORD = """() => { window.__renders = [];
  const chat = document.querySelector('#chat');
  new MutationObserver(() => {
    const b = [...chat.querySelectorAll('[data-testid=bot]')];
    const t = b.length ? b[b.length - 1].innerText : '';
    const r = window.__renders;
    if (t && r[r.length - 1] !== t) r.push(t);
  }).observe(chat, {subtree: true, childList: true, characterData: true}); }"""


def watch(pages: dict, answers: int = 1, timeout: float = 60) -> dict[str, list[str]]:
    """Wait until each page shows `answers` answers, the last one finished; every text the
    last one showed on the way (recorded in the page by RECORD, which `record` installs)."""
    deadline = time.time() + timeout
    for _name, page in pages.items():
        page.wait_for_function(
            f"document.querySelectorAll('#chat [data-testid=bot]').length == {answers}"
            f" && (({LAST_BOT})()).includes('{DONE}')",
            timeout=(deadline - time.time()) * 1e3,
        )
    seen = {name: page.evaluate("window.__renders.splice(0)") for name, page in pages.items()}
    return seen


def record(page) -> None:
    page.evaluate(RECORD)


def streamed(renders: list[str]) -> int:
    """How many different partial answers were shown before the finished one."""
    return len({r for r in renders if "▍" in r})


def open_chat(page, title: str) -> str:
    """Pick a chat in the sidebar by its title; its text once it is in view."""
    page.locator("#conv-list label", has_text=title).first.click()
    page.wait_for_function(
        "([t]) => document.querySelector('#conv-list label.selected')?.innerText.trim() == t"
        " && document.querySelector('#title textarea, #title input').value == t"
        " && !!document.querySelector('#chat [data-testid=user]')",
        arg=[title],
    )
    page.wait_for_timeout(200)
    return page.locator("#chat").inner_text()


def test_two_users_chats_streaming_stop_reload_isolation(server):
    from playwright.sync_api import sync_playwright

    shot = Shots()
    outside: list[str] = []
    local = (server.url, "data:", "blob:", "about:")
    t0 = time.time()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            pages = {}
            for name in ("alice", "bob"):
                ctx = browser.new_context(viewport={"width": 1280, "height": 900})
                ctx.on("request", lambda r: r.url.startswith(local) or outside.append(r.url))
                pages[name] = ctx.new_page()
            alice, bob = pages["alice"], pages["bob"]

            # both sign in at the same time
            for name, page in pages.items():  # noqa: B007
                page.goto(server.url)
            alice.wait_for_selector("input[type=password]")
            shot(alice, "sign-in")
            for name, page in pages.items():
                sign_in(page, server.url, name)
            for page in pages.values():
                ready(page)
                set_number(page, "temperature", 0)  # greedy: the same long replies every run
                record(page)
            assert "alice signed in" in alice.locator("#header").inner_text()

            # each sends in a first chat, at once; both replies stream
            for name, page in pages.items():
                send(page, WORDS[name][0])
            first = watch(pages)
            print("partial renders, first chats:", {n: streamed(r) for n, r in first.items()})
            assert streamed(first["alice"]) >= 3 and streamed(first["bob"]) >= 3, first
            shot(alice, "alice-first-chat")
            shot(bob, "bob-first-chat")

            # each starts a second chat ("New chat") and chats there too
            for page in pages.values():
                new_chat(page)
            for name, page in pages.items():
                send(page, WORDS[name][1])
            second = watch(pages)
            print("partial renders, second chats:", {n: streamed(r) for n, r in second.items()})
            assert streamed(second["alice"]) >= 3 and streamed(second["bob"]) >= 3, second
            for name, page in pages.items():  # each chat is named after its first message, newest first
                page.wait_for_function(f"({CHATS})().length == 2")
                assert page.evaluate(CHATS) == WORDS[name][::-1]
            shot(alice, "alice-second-chat")

            # back in her first chat, alice goes on with that conversation: Markdown and code
            # render, and the earlier turns come from the prefix cache
            open_chat(alice, WORDS["alice"][0])
            send(alice, CODE)
            reply = watch({"alice": alice}, answers=2)["alice"][-1]
            figures = r"(\d+) of (\d+) prompt tokens from cache"
            first_prompt = int(re.search(figures, first["alice"][-1]).group(2))
            cached, prompt = map(int, re.search(figures, reply).groups())
            assert first_prompt <= cached < prompt, reply  # at least the whole first prompt
            assert alice.locator("#chat pre code").count() >= 1 and alice.locator("#chat strong").count() >= 1
            assert alice.locator("#chat .rc-stats").count() == 2  # figures under every answer
            # a copy button on every message, and on the code block
            messages = alice.locator("#chat :is([data-testid=user], [data-testid=bot])").count()
            assert alice.locator("#chat button[aria-label='Copy message']").count() == messages == 4
            assert alice.locator("#chat button.copy_code_button").count() >= 1
            shot(alice, "alice-markdown-and-cache")
            open_chat(alice, WORDS["alice"][1])

            # alice stops a long reply mid-stream: the engine drops it, the text stays
            set_number(alice, "max-tokens", LONG_REPLY)
            send(alice, LONG)
            alice.wait_for_function(f"(({LAST_BOT})()).includes('▍') && (({LAST_BOT})()).length > 60", timeout=30_000)
            alice.wait_for_function("document.querySelector('#send').innerText.trim() == 'Stop'")
            alice.locator("#send").click()  # the one Send/Stop button
            alice.wait_for_function(f"(({LAST_BOT})()).includes('stopped')", timeout=30_000)
            alice.wait_for_function("document.querySelector('#send').innerText.trim() == 'Send'")
            stopped_text = alice.evaluate(LAST_BOT)
            deadline = time.time() + 10
            while (health := httpx.get(server.url + "/health").json())["active_requests"] and time.time() < deadline:
                time.sleep(0.05)
            assert health["active_requests"] == 0 and health["queue_depth"] == 0
            assert server.metric("radixchat:request_success_total", finished_reason="cancelled") == 1
            shot(alice, "alice-stopped")

            # a reload keeps every chat and message
            before = {name: page.evaluate(CHATS) for name, page in pages.items()}
            seen_text = {}
            for name, page in pages.items():
                page.reload()
                ready(page)
                page.wait_for_function(f"({CHATS})().length == {len(before[name])}")
                record(page)
                assert page.evaluate(CHATS) == before[name]
                seen_text[name] = [open_chat(page, words) for words in WORDS[name]]
                for words, text in zip(WORDS[name], seen_text[name]):
                    assert words in text and DONE in text
            assert "items.push(3)" in seen_text["alice"][0]
            assert LONG in seen_text["alice"][1] and "stopped" in seen_text["alice"][1]
            assert stopped_text.split("\n")[0][:30] in seen_text["alice"][1]
            shot(alice, "alice-after-reload")
            shot(bob, "bob-after-reload")

            # neither sees the other's chats or text, anywhere on the page
            for name, other in (("alice", "bob"), ("bob", "alice")):
                everything = pages[name].locator("body").inner_text() + "".join(seen_text[name])
                for words in WORDS[other]:
                    assert words.split()[0] not in everything, (name, words)

            # the Server tab: figures only, refreshed by itself
            alice.get_by_role("tab", name="Server").click()
            alice.wait_for_function(
                "document.querySelector('#server-summary').innerText.includes('Users signed in')", timeout=15_000
            )
            summary = alice.locator("#server-summary").inner_text()
            assert "page-model" in summary and "Prefix cache" in summary
            alice.wait_for_timeout(1500)  # let the plots draw
            server_tab = " ".join(
                alice.locator("#server-summary, #your-usage, #requests-plot, #ttft-plot").all_inner_texts()
            )
            for words in WORDS["bob"] + WORDS["alice"]:  # figures only (her own chats stay in her sidebar)
                assert words.split()[0] not in server_tab
            for words in WORDS["bob"]:
                assert words.split()[0] not in alice.locator("body").inner_text()  # let the plots draw
            shot(alice, "server-tab")

            # rename a chat, open another, find it with the search and open it again
            alice.get_by_role("tab", name="Chat").click()
            open_chat(alice, WORDS["alice"][1])
            alice.locator("#title textarea, #title input").first.fill("Generators, stopped")
            alice.locator("#rename").click()
            alice.wait_for_function(f"({CHATS})().includes('Generators, stopped')")
            open_chat(alice, WORDS["alice"][0])
            alice.locator("#search textarea, #search input").first.fill("generators")
            alice.wait_for_function(f"({CHATS})().length == 1 && ({CHATS})()[0].startsWith('Generators, stopped')")
            alice.locator("#conv-list label").first.click()
            alice.wait_for_function(f"document.querySelector('#chat').innerText.includes({LONG!r})")
            alice.locator("#search textarea, #search input").first.fill("")
            alice.wait_for_function(f"({CHATS})().length == 2")
            shot(alice, "alice-found-again")

            # a refusal is a readable notice, and the typed text stays in the box
            send(alice, "lists " * (PAGE_MODEL_CONTEXT + 500))
            alice.wait_for_selector(".toast-body", timeout=15_000)
            assert "too long for the model" in alice.locator(".toast-body").first.inner_text()
            assert alice.locator("#message textarea").input_value().startswith("lists lists")
            alice.evaluate("window.scrollTo(0, 0)")
            alice.wait_for_timeout(800)  # the notice slides in
            shot(alice, "notice-too-long")
        finally:
            browser.close()
    assert outside == [], f"the page fetched from elsewhere: {outside}"
    print(f"browser test took {time.time() - t0:.0f} s")


QUOKKA = "Quokka-7781 where do <b>they</b> live?"  # the word is only in the message, with markup


def search_chats(page, query: str) -> None:
    """Type in the sidebar's search (a phone opens its drawer first)."""
    if not page.evaluate("document.querySelector('#sidebar').classList.contains('open')"):
        page.locator("#sidebar .toggle-button").click()
        page.wait_for_function("document.querySelector('#sidebar').classList.contains('open')")
        page.wait_for_timeout(400)  # it slides
    page.locator("#search textarea, #search input").first.fill(query)


def test_search_finds_ones_own_chats_by_their_messages(server):
    """alice finds her chat by a word that is only in a message, sees its title and the
    matching text (markup shown as typed), and opens it; bob, at a phone's width, searching
    the same word finds only his own chat."""
    from playwright.sync_api import sync_playwright

    shot = Shots(SHOTS.parent / "page-search")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            widths = {"alice": 1280, "bob": 390}
            pages = {
                name: browser.new_context(viewport={"width": w, "height": 900 if w > 400 else 844}).new_page()
                for name, w in widths.items()
            }
            alice, bob = pages["alice"], pages["bob"]
            for name, page in pages.items():
                sign_in(page, server.url, name)
                ready(page)
                new_chat(page)
                # what a screen reader names them (it was Gradio's defaults: "Textbox", "Radio")
                assert page.get_by_role("textbox", name="Message", exact=True).count() == 1
                assert page.get_by_role("textbox", name="Search your chats", exact=True).count() == 1
                assert page.get_by_role("textbox", name="Textbox", exact=True).count() == 0
            send(alice, QUOKKA)
            send(bob, "Quokka-7781 do wombats and quokkas meet?")
            for page in pages.values():
                page.wait_for_function(f"(({LAST_BOT})()).includes('{DONE}')", timeout=60_000)

            # alice names the chat without the word, starts another, and finds it by its message
            alice.locator("#title textarea, #title input").first.fill("Marsupials")
            alice.locator("#rename").click()
            alice.wait_for_function(f"({CHATS})().includes('Marsupials')")
            new_chat(alice)
            search_chats(alice, "quokka")
            # the label's title and its matching text may arrive in two renders: wait for both
            alice.wait_for_function(f"({CHATS})().length == 1 && ({CHATS})()[0].startsWith('Marsupials — ')")
            [label] = alice.evaluate(CHATS)
            assert label.startswith("Marsupials — ") and QUOKKA in label, label
            assert alice.locator("#conv-list label b, #conv-list label script").count() == 0  # text, not HTML
            shot(alice, "alice-1280-found-by-message")
            alice.locator("#conv-list label").first.click()
            alice.wait_for_function(
                "document.querySelector('#conv-list label.selected')?.innerText.trim().startsWith('Marsupials')"
            )
            alice.wait_for_function("document.querySelector('#chat').innerText.includes('Quokka-7781')")
            shot(alice, "alice-1280-opened")

            # bob, at 390 px, finds his own chat and nothing of alice's
            search_chats(bob, "quokka")
            bob.wait_for_function(f"({CHATS})().length == 1")
            bob.wait_for_timeout(500)
            found = bob.evaluate(CHATS)
            assert len(found) == 1 and found[0].startswith("Quokka-7781 do wombats"), found
            assert "Marsupials" not in bob.locator("body").inner_text()
            assert "they" not in " ".join(found)
            assert bob.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
            shot(bob, "bob-390-found-only-his")

            # the other width for each
            alice.set_viewport_size({"width": 390, "height": 844})
            alice.wait_for_timeout(500)
            search_chats(alice, "quokka")
            alice.wait_for_function(f"({CHATS})().length == 1")
            shot(alice, "alice-390-found")
            bob.set_viewport_size({"width": 1280, "height": 900})
            bob.wait_for_timeout(300)
            assert bob.evaluate(CHATS) == found
            shot(bob, "bob-1280-found-only-his")
        finally:
            browser.close()
