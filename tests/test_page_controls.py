"""The page's controls: one Send/Stop button, export, the Server tab, the temperature.

A real server and Debian's Chromium (the helpers of test_page_browser.py), alice at 1280 px and
bob at 390 px, signed in at once. Server tab: with alice alone it says "1 user", with both "2
users"; both plots span the hour their titles name; each sees their own requests, tokens and
time to first token beside everyone's, never the other's name or text; Gradio's developer
"Settings" is gone from the footer. Send/Stop: one button, "Send" when the chat is idle, "Stop"
while a reply is written there (and only there: another chat reads "Send"), and pressing it
stops the reply in the engine, keeping its text; Enter still sends; on a phone it sits beside
the box, on screen. Export: Markdown and JSON downloads of the store's exports of one's own
chat; bob, through Gradio's queue as the page calls it, gets nothing of alice's. Temperature:
0 for a model without a recommendation, the card's value where it has one. Screenshots go to
test-output/page-controls/.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from radixchat.core.store import Store
from radixchat.webui.page.logic.chat_page import ChatPage, PageError
from tests.support.browser import PHONE, WIDE, Shots, alice_and_bob
from tests.support.clients import PageClient, signed_in
from tests.support.fake_engine import INFO as FAKE_INFO
from tests.support.fake_engine import FakeEngine
from tests.support.page import LAST_BOT, LONG_REPLY, answered, new_chat, ready, say, send, set_number, sign_in
from tests.support.server import CHEAP, page_server

SHOTS = Path(__file__).resolve().parent.parent / "test-output" / "page-controls"
LONG = {
    "alice": "Arrow-5519 tell me everything about generators",
    "bob": "Badger-6613 tell me everything about decorators",
}
BUTTON = "document.querySelector('#send').innerText.trim()"


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    model = request.getfixturevalue("page_model")  # slow enough that a reply can be stopped
    srv = page_server(model, tmp_path_factory.mktemp("page-controls"), "--max-tokens", "200", "--max-batch", "8")
    yield srv
    out = srv.stop()
    assert "Traceback" not in out, out  # bob's calls naming alice's chat are notices, not errors


@pytest.fixture(scope="module")
def shots():
    return Shots(SHOTS)


@pytest.fixture(scope="module")
def pages(browser, server):
    """alice at 1280 px, bob at 390 px; each signs in when a test first needs them."""
    outside: list[str] = []
    made = alice_and_bob(browser, server, outside)
    yield made
    for page in made.values():
        page.context.close()
    assert outside == [], f"the page fetched from elsewhere: {outside}"


def signed(page, server, name: str):
    """`page` signed in as `name`, at its own width, on the Chat tab (whatever a test before left)."""
    if page.locator("#conv-list").count() == 0:
        sign_in(page, server.url, name)
        ready(page)
    page.set_viewport_size(WIDE if name == "alice" else PHONE)
    page.get_by_role("tab", name="Chat").click()
    page.wait_for_selector("#message textarea", state="visible", timeout=10_000)
    return page


def x_axis(page, plot: str) -> float:
    """How many minutes the plot's time axis spans, as vega describes it to screen readers
    ("X-axis titled 'time' for a time scale with values from Tuesday, 01 December 2026,
    9:45:00 AM to ...")."""
    label = page.locator(f"#{plot} [aria-label^='X-axis']").first.get_attribute("aria-label")
    ends = re.search(r"values from (.+) to (.+)$", label)
    assert ends, label
    start, end = (datetime.strptime(t.strip(), "%A, %d %B %Y, %I:%M:%S %p") for t in ends.groups())
    print(plot, label)
    return (end - start).total_seconds() / 60


def server_tab(page, wait_for: str) -> str:
    page.get_by_role("tab", name="Server").click()
    page.wait_for_function(
        f"(document.querySelector('#server-summary')?.innerText || '').includes({wait_for!r})", timeout=20_000
    )
    page.wait_for_function(
        "document.querySelectorAll('#requests-plot svg.marks, #ttft-plot svg.marks').length >= 2", timeout=20_000
    )
    page.wait_for_timeout(800)  # the plots draw
    return page.locator("#server-summary").inner_text()


def usage_row(page, row: str) -> list[str]:
    """The "You" and "Everyone" cells of one row of the Server tab's last-hour table."""
    cells = page.locator("#your-usage tr", has_text=row).first.locator("td").all_inner_texts()
    return [c.strip() for c in cells[1:]]


@pytest.mark.slow
def test_server_tab_windows_plurals_own_usage_and_no_developer_settings(server, pages, shots):
    alice = signed(pages["alice"], server, "alice")
    set_number(alice, "max-tokens", 8)
    say(alice, "Alpaca-1171 what is a list?")

    # alone: "1 user"; both plots span the last hour, points or not
    summary = server_tab(alice, "Users signed in")
    assert re.search(r"Users signed in\s+1 user \(", summary), summary
    assert "1 users" not in summary and "1 requests" not in summary
    for plot in ("requests-plot", "ttft-plot"):
        assert 59 <= x_axis(alice, plot) <= 70, plot  # an hour (a bar plot pads a bar's width)
    # Gradio's developer settings are not in the footer (the page has its own Settings)
    footer = alice.locator("footer")
    assert footer.count() == 0 or "Settings" not in footer.inner_text()
    shots(alice, "server-tab-alone-1280")

    # bob, on a phone, asks twice: each sees their own figures beside everyone's
    bob = signed(pages["bob"], server, "bob")
    set_number(bob, "max-tokens", 8)
    say(bob, "Bison-3391 what is a dict?")
    say(bob, "Beacon-4405 what is a set?")
    alice.wait_for_function("document.querySelector('#server-summary').innerText.includes('2 users')", timeout=20_000)
    alice.wait_for_function(
        "(document.querySelector('#your-usage')?.innerText || '').includes('3 requests')", timeout=20_000
    )
    assert usage_row(alice, "Requests") == ["1 request (0 failed)", "3 requests (0 failed)"]
    you, everyone = usage_row(alice, "Time to first token")
    assert re.fullmatch(r"p50 [\d,]+ ms, p95 [\d,]+ ms", you) and re.fullmatch(
        r"p50 [\d,]+ ms, p95 [\d,]+ ms", everyone
    ), (you, everyone)
    assert re.fullmatch(r"[\d,]+ prompt tokens, [\d,]+ generated", usage_row(alice, "Tokens")[0])
    summary = server_tab(bob, "2 users")
    bob.wait_for_function(
        "(document.querySelector('#your-usage')?.innerText || '').includes('3 requests')", timeout=20_000
    )
    assert usage_row(bob, "Requests") == ["2 requests (0 failed)", "3 requests (0 failed)"]
    assert 59 <= x_axis(bob, "ttft-plot") <= 70 and 59 <= x_axis(bob, "requests-plot") <= 70
    for page, other, theirs in ((alice, "bob", ("Bison", "Beacon")), (bob, "alice", ("Alpaca",))):
        text = page.locator("body").inner_text()
        assert other not in text and not any(w in text for w in theirs), other
        # the Server tab itself: figures only (one's own chats stay listed in one's own sidebar)
        server = " ".join(page.locator("#server-summary, #your-usage, #requests-plot, #ttft-plot").all_inner_texts())
        assert not any(w in server for w in ("Alpaca", "Bison", "Beacon"))
    assert bob.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shots(alice, "server-tab-two-users-1280")
    shots(bob, "server-tab-two-users-390")
    bob.locator("#your-usage").scroll_into_view_if_needed()
    shots(bob, "server-tab-own-usage-390")
    bob.set_viewport_size(WIDE)
    bob.wait_for_timeout(500)
    shots(bob, "server-tab-bob-1280")


def button_reads(page, word: str, timeout: float = 30_000) -> None:
    page.wait_for_function(f"{BUTTON} == {word!r}", timeout=timeout)


@pytest.mark.slow
def test_one_send_stop_button_at_1280_and_390(server, pages, shots):
    alice, bob = signed(pages["alice"], server, "alice"), signed(pages["bob"], server, "bob")
    set_number(alice, "max-tokens", 8)
    new_chat(alice)
    say(alice, "Acorn-1190 an idle chat")  # another chat of alice's, idle while the next one writes
    for page in (alice, bob):
        new_chat(page)
        assert page.locator("#stop").count() == 0  # no separate Stop button
        assert page.evaluate(BUTTON) == "Send"
    # on a phone the button sits beside the box, on screen, and nothing scrolls sideways
    box, field = bob.locator("#send").bounding_box(), bob.locator("#message textarea").bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], box
    assert abs((box["y"] + box["height"] / 2) - (field["y"] + field["height"] / 2)) < box["height"], (box, field)
    assert bob.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]

    # both send a long question with Enter: the button reads Stop in that chat while it is written
    for name, page in (("alice", alice), ("bob", bob)):
        set_number(page, "max-tokens", LONG_REPLY)
        send(page, LONG[name])
    for page in (alice, bob):
        button_reads(page, "Stop")
        page.wait_for_function(f"(({LAST_BOT})()).includes('▍') && (({LAST_BOT})()).length > 40", timeout=30_000)
    assert alice.locator("#send").evaluate("b => b.classList.contains('stop')")
    shots(alice, "writing-stop-1280")
    shots(bob, "writing-stop-390")

    # another chat of alice's is idle: Send there; back in the writing one: Stop, and its reply
    # goes on streaming into view
    for mark, reads in (("Acorn-1190", "Send"), ("Arrow-5519", "Stop")):
        alice.locator("#conv-list label", has_text=mark).click()
        alice.wait_for_function(
            "([m]) => document.querySelector('#conv-list label.selected')?.innerText.includes(m)", arg=[mark]
        )
        button_reads(alice, reads, timeout=10_000)
    before = alice.evaluate(LAST_BOT)
    alice.wait_for_function(
        "([b]) => { const t = [...document.querySelectorAll('#chat [data-testid=bot]')].pop()"
        "?.innerText || ''; return t.includes('▍') && t.length > b.length; }",
        arg=[before],
        timeout=30_000,
    )

    # pressing it stops the reply in the engine, keeps what was written, and it reads Send again
    for page in (alice, bob):
        box = page.locator("#send").bounding_box()
        assert box["x"] + box["width"] <= page.viewport_size["width"]
        page.locator("#send").click()
    for page in (alice, bob):
        page.wait_for_function(f"(({LAST_BOT})()).includes('stopped')", timeout=30_000)
        button_reads(page, "Send", timeout=10_000)
        assert len(page.evaluate(LAST_BOT)) > 40
    deadline = time.time() + 10
    while (health := httpx.get(server.url + "/health").json())["active_requests"] and time.time() < deadline:
        time.sleep(0.05)
    assert health["active_requests"] == 0 and health["queue_depth"] == 0
    assert server.metric("radixchat:request_success_total", finished_reason="cancelled") == 2
    shots(alice, "stopped-send-1280")
    shots(bob, "stopped-send-390")

    # and pressed as Send, it sends
    for page in (alice, bob):
        set_number(page, "max-tokens", 8)
        new_chat(page)
        page.locator("#message textarea").fill("Anchor-2283 what does a tuple hold?")
        page.locator("#send").click()
    for page in (alice, bob):
        answered(page, "Anchor-2283")
        button_reads(page, "Send", timeout=10_000)
    assert server.metric("radixchat:request_success_total", finished_reason="cancelled") == 2


def download(page, button: str) -> tuple[str, str]:
    with page.expect_download(timeout=20_000) as info:
        page.locator(f"#{button}").click()
    d = info.value
    return d.suggested_filename, Path(d.path()).read_text()


@pytest.mark.slow
def test_export_markdown_and_json_of_ones_own_chat_only(server, pages, shots):
    alice, bob = signed(pages["alice"], server, "alice"), signed(pages["bob"], server, "bob")
    marks = {"alice": "Aspen-6627 what is a generator?", "bob": "Bramble-7741 what is a closure?"}
    for name, page in (("alice", alice), ("bob", bob)):
        set_number(page, "max-tokens", 8)
        new_chat(page)
        say(page, marks[name])
    files = {}
    for name, page in (("alice", alice), ("bob", bob)):
        md_name, md = download(page, "export-md")
        json_name, body = download(page, "export-json")
        doc = json.loads(body)
        assert md_name.endswith(".md") and json_name.endswith(".json"), (md_name, json_name)
        assert md.startswith(f"# {marks[name][:20]}") and "## User" in md and marks[name] in md, md
        assert doc["format"] == "radixchat.conversation/1" and doc["owner"] == name
        assert [m["role"] for m in doc["messages"]] == ["user", "assistant"]
        assert doc["messages"][0]["content"] == marks[name]
        files[name] = (md + body, doc["id"])
    assert marks["bob"] not in files["alice"][0] and marks["alice"] not in files["bob"][0]
    shots(alice, "exported-1280")
    shots(bob, "exported-390")

    # through Gradio's queue, the way the page calls it: bob's page session (loaded: his own
    # chats) names alice's chat and gets nothing of it, only a notice; hers gets her conversation
    alice_conv = files["alice"][1]
    clients = {name: PageClient(signed_in(server.url, name)) for name in ("alice", "bob")}
    for client in clients.values():
        r, event = client.join("on_load", [None])
        assert client.messages(event)[-1]["success"]
    for fn in ("export_md", "export_json"):
        r, event = clients["bob"].join(fn, [alice_conv])
        assert r.status_code == 200, r.text
        msgs = clients["bob"].messages(event)
        text = json.dumps(msgs)
        assert msgs[-1]["msg"] == "process_completed" and msgs[-1]["output"]["data"] == [""], msgs[-1]
        assert "no longer exists" in text  # the notice
        assert "Aspen" not in text and "generator" not in text and "alice" not in text, text
    r, event = clients["alice"].join("export_json", [alice_conv])
    done = clients["alice"].messages(event)[-1]
    assert done["success"], done
    assert json.loads(json.loads(done["output"]["data"][0])["text"])["messages"][0]["content"] == marks["alice"]
    # the page's own check, beneath the handler: not found
    with Store(server.db, scrypt=CHEAP) as store:
        page = ChatPage(FakeEngine(), store)
        with pytest.raises(PageError, match="no longer exists"):
            page.export(store.get_user("bob"), alice_conv, "md")
        assert page.export(store.get_user("alice"), alice_conv, "md")[1] in files["alice"][0]


@pytest.mark.slow
def test_temperature_starts_greedy_without_a_recommendation(server, pages, shots):
    for name in ("alice", "bob"):
        page = signed(pages[name], server, name)
        page.reload()
        ready(page)
        value = page.locator("#temperature input[type=number]").input_value()
        assert float(value) == 0.0, (name, value)
        assert "model card" not in page.locator("#temperature").inner_text()
        page.locator("#temperature").scroll_into_view_if_needed()
        shots(page, f"temperature-{name}-{page.viewport_size['width']}")


def test_temperature_starts_at_the_model_cards_recommendation(tmp_path, tiny_model_dir):
    from radixchat.core.config import Settings
    from radixchat.core.models.catalog import SMOLLM2
    from radixchat.core.store import Store
    from radixchat.webui.page.ui.layout import build_page

    def slider(card):
        engine = FakeEngine(info=replace(FAKE_INFO, card=card))
        with Store(tmp_path / f"t{id(card)}.db") as store:
            page = build_page(engine, Settings(model=str(tiny_model_dir)), store)
        return next(b for b in page.blocks.values() if getattr(b, "elem_id", None) == "temperature")

    assert slider(SMOLLM2).value == 0.2 and "model card: 0.2" in slider(SMOLLM2).label
    assert slider(None).value == 0.0
