"""The page's model picker: which model each chat chats with, on a server of several models.

Without a browser, over the real ModelSet of fake engines (tests/support/model_set.py): a
chat's replies go to its model, with that model's card's top-p and under its name in the
metrics; changing the model goes on with the same chat on the new one; a model no longer
served falls back to the first, and one that cannot load is a notice, counted as a refusal;
a new chat takes the model picked for it, also through the handlers' session state; the
picker is on the page only when there are several models. End to end (slow): a real server
of two random models and Chromium at 1280 and 390 px: pick the second, send, reload, and the
picker and the store both still say the second; "New chat" picks the first again.
Screenshots go to test-output/page-models/.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from radixchat.core.models.catalog import Card
from radixchat.core.store import Store
from radixchat.webui.page.events.handlers import Handlers
from radixchat.webui.page.events.view import SHOWN, View
from radixchat.webui.page.logic.chat_page import ChatPage, PageError
from radixchat.webui.page.logic.dashboard import Presence
from tests.support.browser import OUTPUT, Shots, alice_and_bob
from tests.support.model_set import fake_models
from tests.support.page import answered, new_chat, ready, send, sign_in
from tests.support.randmodel import build_random_model
from tests.support.server import CHEAP, page_server, stop_clean

FIRST, SECOND = "tiny-random", "second-random"  # the models' ids: their folders' names
SECOND_CARD = Card(name=SECOND, size="2M parameters", license="MIT", sampling={"temperature": 0.7, "top_p": 0.5})


@pytest.fixture(scope="module")
def second_model(tmp_path_factory) -> Path:
    return build_random_model(tmp_path_factory.mktemp("second") / SECOND, seed=7, dim=48)


@pytest.fixture
def users(store):
    return store.create_user("alice", "alice-password"), store.create_user("bob", "bob-password")


class Counting:
    """The page's metrics: refusals, and the model each ended request is counted under."""

    def __init__(self):
        self.rejections, self.models = 0, []

    def rejected(self, reason: str = "refused"):
        self.rejections += 1

    def observe(self, final, model=None):
        self.models.append(model)


async def collect(agen) -> list:
    return [x async for x in agen]


def reply(page, user, conv, text, **kw) -> list:
    return asyncio.run(collect(page.reply(user, conv, text, **kw)))


def recorded_models(store) -> list[str]:
    with sqlite3.connect(store.path) as c:
        return [r[0] for r in c.execute("SELECT model FROM requests ORDER BY id")]


def test_a_chats_replies_go_to_its_model_and_a_change_goes_on_with_the_next(tiny_model_dir, second_model, store, users):
    models, made = fake_models(tiny_model_dir, second_model, cards={SECOND: SECOND_CARD})
    alice, bob = users
    metrics = Counting()
    page = ChatPage(models, store, metrics)
    assert page.model_ids() == [FIRST, SECOND] and page.first_model() == FIRST
    assert page.loaded_info(SECOND) is None  # nothing loads before a message needs it

    shown = reply(page, alice, None, "Walrus-1 what is a list?", model=SECOND)  # a new chat, second picked
    conv = page.conversations(alice)[0]
    assert conv.model == SECOND and page.model_of(conv) == SECOND
    assert "a reply from second-random" in shown[-1][-1]["content"]
    # before it was loaded, the chat said so under the message sent, not nothing for seconds
    assert "Walrus-1" in shown[0][0]["content"] and f"Loading {SECOND}" in shown[0][-1]["content"]
    assert not any("Loading" in rows[-1]["content"] for rows in shown[1:])
    assert list(made) == [FIRST, SECOND] and made[FIRST].requests == []  # loaded for it, the first untouched
    assert made[SECOND].requests[0].sampling.top_p == 0.5  # its own card's recommendation
    assert page.loaded_info(SECOND).card == SECOND_CARD

    # the same chat goes on with the first model: it reads the whole chat so far
    assert page.set_model(alice, conv.id, "default") == FIRST  # an alias names the served id
    reply(page, alice, conv.id, "Walrus-2 and a tuple?")
    [asked] = made[FIRST].requests
    assert [m.content for m in asked.messages] == [
        "Walrus-1 what is a list?",
        "a reply from second-random",
        "Walrus-2 and a tuple?",
    ]
    assert asked.sampling.top_p == 1.0  # no card: nothing recommended
    assert recorded_models(store) == [SECOND, FIRST] and metrics.models == [SECOND, FIRST]
    assert page.conversation(alice, conv.id).model == FIRST

    # a name not served changes nothing; nor can bob change alice's chat
    with pytest.raises(PageError, match="does not serve"):
        page.set_model(alice, conv.id, "gpt-9")
    with pytest.raises(PageError, match="no longer exists"):
        page.set_model(bob, conv.id, SECOND)
    assert page.conversation(alice, conv.id).model == FIRST and metrics.rejections == 0
    models.stop()


def test_a_model_not_served_falls_back_to_the_first_and_one_that_cannot_load_is_a_notice(
    tiny_model_dir, second_model, store, users
):
    models, made = fake_models(tiny_model_dir, second_model, fail={SECOND})
    alice, _ = users
    metrics = Counting()
    page = ChatPage(models, store, metrics)

    # a chat of a model this server no longer serves chats with the first, and keeps its name
    old = store.create_conversation(alice, "from before a restart", model="retired-model")
    reply(page, alice, old.id, "Otter-1 hello")
    assert len(made[FIRST].requests) == 1 and page.conversation(alice, old.id).model == "retired-model"
    assert page.model_of(page.conversation(alice, old.id)) == FIRST
    # a new chat picked with a name not served is the first model's
    reply(page, alice, None, "Otter-2 a new chat", model="retired-model")
    assert page.conversations(alice)[0].model is None and len(made[FIRST].requests) == 2

    # the second cannot load (no memory for it): a notice, counted, nothing stored, nothing left running
    conv = page.new_chat(alice, model=SECOND)
    with pytest.raises(PageError, match=r"not available right now.*could not be loaded"):
        reply(page, alice, conv.id, "Otter-3 are you there?")
    assert metrics.rejections == 1 and store.history(alice, conv.id) == [] and page.running == {}
    assert SECOND not in made
    page.set_model(alice, conv.id, FIRST)  # back on the first, the chat goes on
    reply(page, alice, conv.id, "Otter-4 and now?")
    assert [m.content for m in store.history(alice, conv.id)] == ["Otter-4 and now?", "a reply from tiny-random"]
    models.stop()


def test_a_new_chat_takes_the_model_picked_for_it_and_a_chat_in_view_shows_its_own(tiny_model_dir, second_model, store):
    """Through the handlers, as the page calls them: the picker's value and the line under it
    follow the chat in view, and a pick made while a new chat is in view is that chat's."""
    models, made = fake_models(tiny_model_dir, second_model, cards={SECOND: SECOND_CARD})
    page = ChatPage(models, store, signed_in=False)
    h = Handlers(page, Presence(), {}, page.engine.info, sign_in=False)
    view = View()
    at = {name: i for i, name in enumerate(SHOWN)}

    loaded = h.on_load(view, None)[1:]  # a first visit: a new chat, the first model
    assert loaded[at["model"]] == FIRST and "loaded" in loaded[at["model_note"]].lower()
    note, slider = h.model_picked(SECOND, None, view, None)
    assert "loads on its first message" in note and slider.label == "Temperature"  # its card not known yet
    assert view.model == SECOND and store.list_conversations(page.user(None)) == []  # nothing made yet

    async def scripted_send():  # `respond`: a client that sends no picker value
        return [out async for out in h.respond("Heron-1 hi", None, 0, 8, view, None)]

    asyncio.run(scripted_send())
    [conv] = store.list_conversations(page.user(None))
    assert conv.model == SECOND and len(made[SECOND].requests) == 1
    assert h.model_shown(SECOND) == "2M parameters, MIT · loaded"

    # another chat, on the first model; each shows its own when it comes into view
    other = page.new_chat(page.user(None))
    shown = h.switch(other.id, view.epoch + 1, "", view, None)
    assert shown[at["model"]] == FIRST and shown[at["current"]] == other.id
    assert shown[at["temperature"]].label == "Temperature"  # the first has no card
    shown = h.switch(conv.id, view.epoch + 1, "", view, None)
    assert shown[at["model"]] == SECOND and shown[at["model_note"]] == "2M parameters, MIT · loaded"
    # the temperature's label is the chat's model's card's (it kept the first model's)
    assert shown[at["temperature"]].label == "Temperature (model card: 0.7; top-p 0.5)"
    note, slider = h.model_picked(FIRST, conv.id, view, None)  # picked with a chat in view: stored on it
    assert slider.label == "Temperature"
    assert page.conversation(page.user(None), conv.id).model == FIRST and view.model is None
    # "New chat": the first model again, whatever the chat before had
    h.model_picked(SECOND, None, view, None)
    h.new_chat_opened(view.epoch + 1, view)
    assert view.model is None
    models.stop()


def test_the_picker_is_on_the_page_only_with_several_models(tmp_path, tiny_model_dir, second_model):
    from radixchat.core.config import Settings
    from radixchat.core.store import Store
    from radixchat.webui.page.ui.layout import build_page

    def picker(*folders):
        models, _ = fake_models(*folders)
        with Store(tmp_path / f"p{len(folders)}.db") as store:
            page = build_page(models, Settings(model=str(tiny_model_dir)), store)
        models.stop()
        return next(b for b in page.blocks.values() if getattr(b, "elem_id", None) == "model")

    several = picker(tiny_model_dir, second_model)
    assert several.visible and several.label == "Model" and several.value == FIRST
    assert [c[1] for c in several.choices] == [FIRST, SECOND]
    assert not picker(tiny_model_dir).visible


# ---- end to end: a real server of two models, Chromium ----

PICKED = "() => document.querySelector('#model input')?.value"
NOTE = "() => document.querySelector('#model-note')?.innerText.trim() ?? ''"
LOADED = f"() => /(^|· )loaded$/i.test(({NOTE})())"  # pick_note's words for a model loaded now


@pytest.fixture(scope="module")
def server(tiny_model_dir, second_model, tmp_path_factory):
    srv = page_server(
        tiny_model_dir, tmp_path_factory.mktemp("page-models"), "--model", str(second_model), "--max-tokens", "12"
    )
    yield srv
    stop_clean(srv)


def pick(page, model: str) -> None:
    """Pick `model` in the picker, as a person would: open its list, click the model."""
    page.locator("#model input").click()
    page.locator("[data-testid=dropdown-option]", has_text=model).first.click()
    page.wait_for_function(f"({PICKED})() == {model!r}")


def stored(server, name: str) -> list[tuple[str | None, list[str]]]:
    """What the store holds for `name`: each chat's model and the models its replies were
    written by, newest chat first."""
    with Store(server.db, scrypt=CHEAP) as store:
        user = store.get_user(name)
        convs = store.list_conversations(user, archived=None)
        out = []
        for c in convs:
            requests = [m.request for m in store.history(user, c.id) if m.role == "assistant"]
            with sqlite3.connect(server.db) as db:
                models = [db.execute("SELECT model FROM requests WHERE id = ?", [r]).fetchone()[0] for r in requests]
            out.append((c.model, models))
        return out


@pytest.mark.slow
def test_the_second_model_picked_answers_and_stays_picked_at_1280_and_390(server, browser):
    shot = Shots(OUTPUT / "page-models")
    outside: list[str] = []
    pages = alice_and_bob(browser, server, outside)  # alice at 1280 px, bob at 390 px
    for name, page in pages.items():
        sign_in(page, server.url, name)
        ready(page)
        assert page.evaluate(PICKED) == FIRST and page.locator("#model").is_visible()  # a new chat: the first
        mark = f"{name.capitalize()}-7{len(name)} what is a list?"
        pick(page, SECOND)
        if name == "alice":  # the second is not loaded until a message needs it
            # (the note is redrawn by the pick's event: wait for it, not for the old text)
            page.wait_for_function(f"({NOTE})().includes('loads on its first message')", timeout=10_000)
        shot(page, f"picked-{name}")
        send(page, mark)
        assert answered(page, mark.split()[0])
        page.wait_for_function(LOADED)
        # who answered: under the answer; the header names no one model
        assert SECOND in page.locator("#chat [data-testid=bot] .rc-stats").last.inner_text()
        assert FIRST not in page.locator("#header").inner_text() and "2 models" in page.locator("#header").inner_text()
        shot(page, f"answered-{name}")

        page.reload()
        ready(page)
        page.wait_for_function("!!document.querySelector('#chat [data-testid=bot]')")  # the chat is back
        page.wait_for_function(f"({PICKED})() == {SECOND!r} && ({LOADED})()", timeout=10_000)
        page.locator("#model").scroll_into_view_if_needed()
        shot(page, f"reloaded-{name}")
        assert stored(server, name) == [(SECOND, [SECOND])]
        new_chat(page)  # a new chat: the first model again, picked in the browser at once
        page.wait_for_function(f"({PICKED})() == {FIRST!r}")
    assert outside == []
