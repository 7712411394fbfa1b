"""The page's events: which handler each component's event calls, with which inputs and
outputs, in which queue, and the browser's part of an event (Gradio's `js=`).

`Parts` holds every component an event names, as the page's parts built them
(webui/page/ui/sidebar.py, chat_panel.py, chat_settings.py, server_tab.py); the handlers are
webui/page/events/handlers.py's. Events are registered in one fixed order, the order of the page's
API: scripted clients find an event by its handler's name. Every event is private to the
page (no public API); the sends share one queue (`generating`) sized for the engine's batch
and queue, and Stop stays outside it, as does following the reply being written in a chat
that came into view (`following`: only a watcher of the server's reply), and a tab's sync with
its user's other tabs (`sync`, webui/page/events/sync.py), which the browser asks for every few
seconds. Drafts, keys and the sync's pace are the browser's (webui/page/ui/shortcuts.py). Runs
once, when the page is built; no MLX.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gradio as gr

from radixchat.webui.page.events.sending import FOLLOWING, REPLYING
from radixchat.webui.page.events.view import SHOWN
from radixchat.webui.page.logic import versions
from radixchat.webui.page.ui.scripts import (
    ABOUT,
    EDITING,
    KEEP_SETTINGS,
    OPEN_WIDE,
    PICK,
    RESTORE_SETTINGS,
    SAVE,
    new_chat,
)
from radixchat.webui.page.ui.shortcuts import KEEP_DRAFT, KEYS, SYNC, show_draft

if TYPE_CHECKING:
    from gradio.blocks import Block

    from radixchat.core.config import Settings
    from radixchat.webui.page.events.handlers import Handlers
    from radixchat.webui.page.ui.chat_panel import ChatArea
    from radixchat.webui.page.ui.chat_settings import ChatSettings, ThisChat
    from radixchat.webui.page.ui.server_tab import ServerTab
    from radixchat.webui.page.ui.sidebar import Sidebar

PRIVATE: dict[str, Any] = {"api_visibility": "private"}


def following(p: Parts, h: Handlers) -> dict[str, Any]:
    """A chat that came into view follows the reply being written there, if any, to its end:
    outside the sends' queue (it only watches), and once per view change, however many run."""
    return {
        "fn": h.follow_reply,
        "inputs": [p.current, p.epoch, p.area.send, p.view],
        "outputs": p.named(FOLLOWING),
        "concurrency_id": "follow",
        "concurrency_limit": None,
        "show_progress": "hidden",
        "trigger_mode": "multiple",
        **PRIVATE,
    }


@dataclass
class Parts:
    """The components the events name."""

    view: gr.State  # the session's View
    current: gr.Number  # the chat in view, as the browser has it
    epoch: gr.Number  # the browser's count of view changes
    header: gr.Markdown
    browser_key: gr.Textbox  # hidden: what this user's settings and drafts are kept under
    side: Sidebar
    area: ChatArea
    this: ThisChat
    settings: ChatSettings  # the accordion of that name
    chat_section: gr.Tab
    server_section: gr.Tab
    server: ServerTab

    def named(self, names: tuple[str, ...]) -> list[Block]:
        """Components by name, wherever on the page they are (`SHOWN`, `REPLYING`)."""
        groups = (self, self.side, self.area, self.this, self.settings)
        return [next(getattr(g, n) for g in groups if hasattr(g, n)) for n in names]


def wire(page: gr.Blocks, p: Parts, h: Handlers, config: Settings) -> None:
    """Every event of the page, in the page's API order."""
    wire_load(page, p, h)
    wire_versions(p, h)
    wire_chats(p, h)
    wire_system_prompt(p, h)
    wire_model(p, h)
    wire_sends(p, h, config)
    wire_export_and_share(p, h)
    wire_server_tab(p, h)
    wire_sync(p, h)


def drafted(p: Parts, *, replace: bool) -> dict[str, Any]:
    """The browser's step that puts the draft of the chat now in view in the message box."""
    typed = [p.browser_key, p.current, p.area.message]
    return {"fn": None, "inputs": typed, "outputs": [p.area.message], "js": show_draft(replace=replace), **PRIVATE}


def wire_load(page: gr.Blocks, p: Parts, h: Handlers) -> None:
    panel = p.settings
    numbers = [panel.temperature, panel.max_tokens]
    loaded = page.load(h.on_load, [p.view], [p.header, *p.named(SHOWN), p.browser_key], **PRIVATE)
    loaded.then(None, [p.header], [p.side.about], js=ABOUT, **PRIVATE).then(
        None, [p.browser_key, *numbers], numbers, js=RESTORE_SETTINGS, **PRIVATE
    )
    loaded.then(**following(p, h))  # a reply being written in the chat opened streams on
    loaded.then(**drafted(p, replace=False))
    # `input`: set by the person (a restore sets them too, and needs no keeping)
    for number in numbers:
        number.input(None, [p.browser_key, *numbers], None, js=KEEP_SETTINGS, **PRIVATE)
    page.load(None, js=OPEN_WIDE, **PRIVATE)
    page.load(None, js=versions.LISTEN, **PRIVATE)
    page.load(None, js=KEYS, **PRIVATE)
    page.load(None, js=SYNC, **PRIVATE)


def wire_versions(p: Parts, h: Handlers) -> None:
    area = p.area
    # ‹ › or Edit in a message: the browser hands over what was clicked, then the server acts
    area.versions_go.click(None, None, [area.asked], js=versions.ASKED, **PRIVATE).then(
        h.version_asked, [area.asked, p.current, p.view], [area.chatbot, area.message, area.edit_bar], **PRIVATE
    ).then(None, js=EDITING, **PRIVATE)
    area.cancel_edit.click(h.edit_cancelled, [p.view], [area.message, area.edit_bar], **PRIVATE)


def wire_chats(p: Parts, h: Handlers) -> None:
    side, this, view_outputs = p.side, p.this, p.named(SHOWN)
    # a chat picked or "New chat": the browser changes its view at once, then the server follows
    side.conv_list.input(None, [side.conv_list, p.epoch], [p.current, p.epoch], js=PICK, **PRIVATE).then(
        **drafted(p, replace=True)
    ).then(h.switch, [p.current, p.epoch, side.search, p.view], view_outputs, **PRIVATE).then(**following(p, h))
    side.new.click(
        None,
        [p.epoch],
        [  # new_chat's values, in its order
            p.current,
            side.conv_list,
            p.area.chatbot,
            this.title,
            p.settings.system,
            p.settings.preset,
            this.share_link,
            p.epoch,
            p.settings.model,
        ],
        js=new_chat(h.chat.first_model()),
        **PRIVATE,
    ).then(**drafted(p, replace=True)).then(
        h.new_chat_opened, [p.epoch, p.view], [p.area.send, p.area.edit_bar, p.settings.model_note], **PRIVATE
    )
    side.search.change(h.find, [side.search, p.current], [side.conv_list], show_progress="hidden", **PRIVATE)
    gr.on(
        [this.rename.click, this.title.submit],
        h.rename_chat,
        [p.current, this.title, side.search, p.view],
        [side.conv_list, this.title],
        **PRIVATE,
    )
    undoing = [side.undo, side.undo_timer]
    this.delete.click(h.delete_chat, [p.current, side.search, p.view], [*view_outputs, *undoing], **PRIVATE).then(
        **drafted(p, replace=True)
    )
    side.undo.click(h.undo_delete, [side.search, p.view], [*view_outputs, *undoing], **PRIVATE).then(
        **drafted(p, replace=True)
    )
    side.undo_timer.tick(h.undo_expired, [p.view], undoing, show_progress="hidden", **PRIVATE)


def wire_system_prompt(p: Parts, h: Handlers) -> None:
    panel = p.settings
    panel.preset.input(h.apply_preset, [panel.preset, p.current], [panel.system], **PRIVATE)
    panel.system.blur(h.save_system, [panel.system, p.current], [panel.preset], **PRIVATE)


def wire_model(p: Parts, h: Handlers) -> None:
    panel = p.settings
    # `input`, not `change`: a chat coming into view sets the picker too, and must not store it
    panel.model.input(
        h.model_picked,
        [panel.model, p.current, p.view],
        [panel.model_note, panel.temperature],
        show_progress="hidden",
        **PRIVATE,
    )


def wire_sends(p: Parts, h: Handlers, config: Settings) -> None:
    area, panel = p.area, p.settings
    generating: dict[str, Any] = {
        "concurrency_id": "generate",
        "show_progress": "hidden",
        "trigger_mode": "multiple",
        "concurrency_limit": max(config.max_batch, config.max_queue),
        **PRIVATE,
    }
    replying = p.named(REPLYING)
    asked = [p.current, panel.system, p.epoch, p.side.search, panel.temperature, panel.max_tokens, panel.model, p.view]
    # after a send, the line under the picker again: the model may have loaded for its reply
    noted: dict[str, Any] = {
        "fn": h.model_shown,
        "inputs": [panel.model],
        "outputs": [panel.model_note],
        "show_progress": "hidden",  # a timer ("0.0s") over the note otherwise
        **PRIVATE,
    }
    area.message.submit(h.send_message, [area.message, *asked], replying, **generating).then(**noted)
    # one click, two events: each acts only if the button read its word when pressed
    area.send.click(h.send_pressed, [area.send, area.message, *asked], replying, **generating).then(**noted)
    area.send.click(
        h.stop_pressed, [area.send, p.current], [area.send], concurrency_limit=None, show_progress="hidden", **PRIVATE
    )
    again = [p.current, p.epoch, p.side.search, panel.temperature, panel.max_tokens, p.view]
    area.regenerate.click(h.respond_again, again, replying, **generating).then(**noted)
    area.go_on.click(h.continue_answer, again, replying, **generating).then(**noted)
    # no browser presses it: scripted clients call its two events by name (sending.py)
    scripted = gr.Button(visible=False)
    scripted.click(h.new_tab, [panel.system, p.view], [p.side.conv_list, p.current, *p.named(SHOWN)[2:]], **PRIVATE)
    scripted.click(
        h.respond, [area.message, p.current, panel.temperature, panel.max_tokens, p.view], replying, **generating
    )


def wire_export_and_share(p: Parts, h: Handlers) -> None:
    this = p.this
    for button, fmt in ((this.export_md, "md"), (this.export_json, "json")):
        button.click(h.export(fmt), [p.current], [this.exported], **PRIVATE).then(
            None, [this.exported], None, js=SAVE, **PRIVATE
        )
    this.share.click(h.share_tab, [p.current], [this.share_link], **PRIVATE)
    this.unshare.click(h.unshare_tab, [p.current], [this.share_link], **PRIVATE)


def wire_server_tab(p: Parts, h: Handlers) -> None:
    figures, timer = p.server.figures, p.server.timer
    # one function object for both events: Gradio groups an event's concurrency by its function
    refresh = h.refresh
    p.server_section.select(lambda: gr.Timer(active=True), None, timer, **PRIVATE).then(
        refresh, None, figures, **PRIVATE
    )
    p.chat_section.select(lambda: gr.Timer(active=False), None, timer, **PRIVATE)
    timer.tick(refresh, None, figures, show_progress="hidden", **PRIVATE)


def wire_sync(p: Parts, h: Handlers) -> None:
    side, box = p.side, p.area.message
    # the draft: kept as the box changes, and dropped once a send empties it (shortcuts.py)
    box.change(None, [p.browser_key, p.current, box], None, js=KEEP_DRAFT, **PRIVATE)
    # pressed by the browser every few seconds while the tab is visible (shortcuts.SYNC): only
    # the last of those waiting runs; cheap, and outside the sends' queue
    side.sync_go.click(
        h.synced,
        [side.search, p.current, side.follow_go, p.this.title, p.view],
        [side.conv_list, side.follow_go, p.this.title],
        concurrency_id="sync",
        concurrency_limit=None,
        show_progress="hidden",
        trigger_mode="always_last",
        **PRIVATE,
    )
    side.follow_go.change(**following(p, h))  # a reply begun elsewhere in the chat in view
