"""What the page's events do, apart from sending: loading the page, a chat picked, "New chat",
another version or Edit in a message, search, rename, delete and undo, the system prompt,
the model picked, export and share.

Each handler takes what its event's inputs hold and returns what goes to its outputs (which
components, webui/page/events/wiring.py says); what it does to the chats is ChatPage's
(webui/page/logic/chat_page.py). A refusal is a notice and changes nothing on the page. `Handlers` is
every handler of the page: these, sending (webui/page/events/sending.py), a tab's sync with its
user's other tabs (webui/page/events/sync.py) and the Server tab's refresh
(webui/page/ui/server_tab.py). Runs in Gradio's worker threads. No MLX.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from typing import Any

import gradio as gr

from radixchat.webui.page.events.sending import Sending
from radixchat.webui.page.events.sync import Syncing
from radixchat.webui.page.events.view import (
    CUSTOM,
    SHOWN,
    PageView,
    Shown,
    Skip,
    View,
    notice,
    notices,
    skip_output,
)
from radixchat.webui.page.logic import versions
from radixchat.webui.page.logic.errors import PageError
from radixchat.webui.page.logic.model_card import header
from radixchat.webui.page.ui.server_tab import ServerTabHandlers
from radixchat.webui.page.ui.sidebar import UNDO_S

MEDIA_TYPES = {"md": "text/markdown", "json": "application/json"}


class ChatHandlers(PageView):
    """The page's handlers for everything but sending and the Server tab."""

    # ---- what is in view ----

    @notices(2 + len(SHOWN))
    def on_load(self, view: View, request: gr.Request) -> tuple[Any, ...]:
        """The header, the chat to open, and the user's browser key: what the browser keeps
        their settings and drafts under (webui/page/ui/scripts.py, shortcuts.py)."""
        user = self.who(request)
        who_line = f"**{user.name}** signed in" if self.sign_in else "no sign-in: everyone here is the same local user"
        shown = self.shown(user, self.chat.start(user), "", view, request)
        header_line = header(self.model, who_line, len(self.chat.model_ids()))
        return (header_line, *shown, self.chat.browser_key(user))

    @notices(len(SHOWN))
    def switch(
        self, conv_id: int | None, stamp: int | None, query: str, view: View, request: gr.Request
    ) -> Shown | tuple[Skip, ...]:
        """A chat picked in the sidebar (the browser already set `current`)."""
        user = self.who(request)
        if conv_id is None:
            return tuple(gr.skip() for _ in SHOWN)
        conv = self.chat.show(user, int(conv_id))  # someone else's: "not found", and nothing changes
        if not view.follow(conv.id, stamp, change=True):
            return tuple(gr.skip() for _ in SHOWN)
        return self.shown(user, conv.id, query, view, request)

    def new_chat_opened(self, stamp: int | None, view: View) -> tuple[gr.Button, gr.Row, str]:
        """ "New chat" (the browser already shows it, with the first model picked): its reply,
        if any, stops being drawn here."""
        if view.follow(None, stamp, change=True):
            view.model = None
        view.editing = None
        return self.action(False), gr.Row(visible=False), self.note_of(self.chat.first_model())

    @notices(3)
    def version_asked(
        self, what: str, conv_id: int | None, view: View, request: gr.Request
    ) -> tuple[list[dict[str, Any]] | Skip, str | Skip, gr.Row | Skip]:
        """‹ › or Edit pressed in a message of the chat in view (versions.LISTEN): another
        version comes into view, or the message's text goes into the box to be sent again."""
        user, picked = self.who(request), versions.parse(what)
        if picked is None or conv_id is None:
            return gr.skip(), gr.skip(), gr.skip()
        kind, message_id = picked
        conv_id = int(conv_id)
        if kind == versions.SHOW:
            rows = self.chat.show_version(user, conv_id, message_id)
            was_editing, view.editing = view.editing, None  # the edited text goes with its edit
            return rows, "" if was_editing else gr.skip(), gr.Row(visible=False)
        text = self.chat.edit_text(user, conv_id, message_id)
        view.editing = (conv_id, message_id)
        return gr.skip(), text, gr.Row(visible=True)

    def edit_cancelled(self, view: View) -> tuple[str, gr.Row]:
        view.editing = None
        return "", gr.Row(visible=False)

    # ---- the list of chats ----

    @notices(1)
    def find(self, query: str, conv_id: int | None, request: gr.Request) -> gr.Radio:
        return self.listed(self.who(request), query, conv_id)

    @notices(2)
    def rename_chat(
        self, conv_id: int | None, new_title: str, query: str, view: View, request: gr.Request
    ) -> tuple[gr.Radio, str]:
        user = self.who(request)
        conv = self.chat.rename(user, conv_id, new_title)
        if conv.id == view.conv:
            view.title = conv.title
        return self.listed(user, query, conv.id), conv.title

    @notices(len(SHOWN) + 2)
    def delete_chat(self, conv_id: int | None, query: str, view: View, request: gr.Request) -> tuple[Any, ...]:
        """Delete the chat in view: a new chat comes into view, and "Undo delete" for UNDO_S."""
        user = self.who(request)
        gone = self.chat.delete(user, conv_id)
        view.deleted = gone.id
        gr.Info(
            f"Deleted “{html.escape(gone.title)}”. “Undo delete” in the list brings it back for {UNDO_S:g} seconds."
        )
        return (*self.shown(user, None, query, view, request), gr.Button(visible=True), gr.Timer(active=True))

    @notices(len(SHOWN) + 2)
    def undo_delete(self, query: str, view: View, request: gr.Request) -> tuple[Any, ...]:
        user = self.who(request)
        back = self.chat.undo_delete(user, view.deleted)
        view.deleted = None
        self.chat.show(user, back.id)
        return (*self.shown(user, back.id, query, view, request), gr.Button(visible=False), gr.Timer(active=False))

    def undo_expired(self, view: View) -> tuple[gr.Button, gr.Timer]:
        view.deleted = None
        return gr.Button(visible=False), gr.Timer(active=False)

    # ---- the system prompt ----

    @notices(1)
    def apply_preset(self, name: str, conv_id: int | None, request: gr.Request) -> str | Skip:
        if name == CUSTOM:
            return skip_output()
        text = self.presets.get(name, "")
        if conv_id is not None:  # a new chat takes it with its first message
            self.chat.set_system_prompt(self.who(request), int(conv_id), text)
        return text

    @notices(1)
    def save_system(self, text: str, conv_id: int | None, request: gr.Request) -> str:
        if conv_id is not None:
            self.chat.set_system_prompt(self.who(request), int(conv_id), text)
        return self.preset_of(text)

    # ---- the model ----

    @notices(2)
    def model_picked(self, name: str, conv_id: int | None, view: View, request: gr.Request) -> tuple[str, gr.Slider]:
        """A model picked: the chat in view's next replies are its; a new chat's first message
        makes a conversation that chats with it. The line under the picker says what it is,
        and the temperature's label what its card recommends (it kept the first model's)."""
        if conv_id is None:
            model = view.model = self.chat.picked(name)
        else:
            model = self.chat.set_model(self.who(request), int(conv_id), name)
        return self.note_of(model), self.slider_of(model)

    def model_shown(self, name: str | None) -> str:
        """The line under the picker again after a send: the model may have loaded for it."""
        return self.note_of(self.chat.served_name(name) or self.chat.first_model())

    # ---- export and share ----

    def export(self, fmt: str) -> Callable[[int | None, gr.Request], str]:
        def export_tab(conv_id: int | None, request: gr.Request) -> str:
            """The chat as the store exports it, for the browser to save (SAVE)."""
            try:
                name, text = self.chat.export(self.who(request), None if conv_id is None else int(conv_id), fmt)
            except PageError as e:
                notice(e)
                return ""  # nothing to save, whatever an earlier export left here
            return json.dumps({"name": name, "type": MEDIA_TYPES[fmt], "text": text})

        export_tab.__name__ = f"export_{fmt}"
        return export_tab

    @notices(1)
    def share_tab(self, conv_id: int | None, request: gr.Request) -> str:
        return self.link_of(self.chat.share(self.who(request), None if conv_id is None else int(conv_id)), request)

    @notices(1)
    def unshare_tab(self, conv_id: int | None, request: gr.Request) -> str:
        self.chat.unshare(self.who(request), None if conv_id is None else int(conv_id))
        gr.Info('Stopped sharing: the link now shows "not found".')
        return ""


class Handlers(ChatHandlers, Sending, Syncing, ServerTabHandlers):
    """Every handler of the page, over one ChatPage."""
