"""What a browser session has in view, and the ground every page handler stands on.

`View` is one session's state (Gradio's `State`): the chat in view, the browser's count of
view changes, the chat "Undo delete" brings back, the message being edited, the model picked
for a new chat. `PageView` is the base of the handlers (webui/page/events/handlers.py, sending.py,
server_tab.py): who is asking, the sidebar's list, the Send/Stop button, the share link, the
line under the model picker, and everything that changes when a chat comes into view
(`shown`, in the order of `SHOWN`, the picker showing that chat's model among them). A
`PageError` from the logic (webui/page/logic/chat_page.py) becomes a notice (`notices`). Which
components these values go to is webui/page/events/wiring.py's.

Runs in Gradio's worker threads and on the server's event loop (the async handlers). No MLX.
"""

from __future__ import annotations

import functools
import html
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

import gradio as gr

from radixchat.webui.page.logic.errors import PageError
from radixchat.webui.page.logic.model_card import pick_note, temperature_label
from radixchat.webui.page.routes.shared import link as shared_link

log = logging.getLogger("radixchat.page")

if TYPE_CHECKING:
    from radixchat.core.seam.protocol import ModelInfo
    from radixchat.core.store import User
    from radixchat.webui.page.logic.chat_page import ChatPage
    from radixchat.webui.page.logic.dashboard import Presence

P = ParamSpec("P")
T = TypeVar("T")
# gr.skip(): the output stays as it is (Gradio's own annotation of it is a bare dict). Gradio
# reads handlers' annotations at run time (a gr.Request parameter), so this is no TYPE_CHECKING name.
Skip = dict[str, Any]

NO_PROMPT, CUSTOM = "None", "Custom"  # the system-prompt presets that are not one
SEND, STOP = "Send", "Stop"
# what `PageView.shown` returns, in its order (wiring.py's `view_outputs`)
SHOWN = (
    "current",
    "conv_list",
    "chatbot",
    "title",
    "system",
    "preset",
    "send",
    "share_link",
    "edit_bar",
    "model",
    "model_note",
    "temperature",
)
# its values' types, in that order
Shown = tuple[int | None, gr.Radio, list[dict[str, Any]], str, str, str, gr.Button, str, gr.Row, str, str, gr.Slider]


@dataclass
class View:
    """Per browser session: the conversation the chat area shows (None: a new chat), the
    browser's count of view changes it follows (`epoch`), the chat "Undo delete" brings back,
    the message being edited (its "Edit" was pressed: the next Send makes a new version of
    it), as (conversation, message), and the model picked while a new chat is in view (None:
    the first), which its first message's conversation takes; any change of view ends both.
    For catching up with other tabs (webui/page/events/sync.py): the sidebar's list as last synced,
    the reply this tab watches, as (conversation, when it began), and the title this tab last
    put in the chat in view's title box."""

    conv: int | None = None
    epoch: int = 0
    deleted: int | None = None
    editing: tuple[int, int] | None = None
    model: str | None = None
    listed: list[tuple[str, int]] | None = None
    watching: tuple[int, float] | None = None
    title: str | None = None

    def follow(self, conv: int | None, epoch: int | float | None, *, change: bool = False) -> bool:
        """Show `conv` unless the browser has changed its view since (a later epoch). A view
        change (`change`: a pick, "New chat") counts only if it is newer than what is shown: a
        message sent to a new chat made it under the same epoch, and stays in view."""
        epoch = int(epoch or 0)
        if epoch < self.epoch or (change and epoch == self.epoch):
            return False
        self.epoch, self.conv = epoch, conv
        return True


def skip_output() -> Skip:
    """`gr.skip()`, for a handler to return: Gradio annotates it (a dict), but its `@document`
    decorator hides that from a type checker, which sees Any."""
    return cast(Skip, gr.skip())


def notice(e: PageError) -> None:
    """A PageError as a notice. Gradio shows a notice's text as (sanitized) HTML; escaped, it
    is text, whatever of a request or a reply it quotes."""
    gr.Warning(html.escape(e.message))


def notices(n_outputs: int) -> Callable[[Callable[P, T]], Callable[P, T | Skip | tuple[Skip, ...]]]:
    """Turn a PageError into a notice on the page, leaving the outputs as they are."""

    def wrap(fn: Callable[P, T]) -> Callable[P, T | Skip | tuple[Skip, ...]]:
        @functools.wraps(fn)
        def inner(*args: P.args, **kwargs: P.kwargs) -> T | Skip | tuple[Skip, ...]:
            try:
                return fn(*args, **kwargs)
            except PageError as e:
                notice(e)
                skip = tuple(gr.skip() for _ in range(n_outputs))
                return skip[0] if n_outputs == 1 else skip

        return inner

    return wrap


class PageView:
    """What every handler needs: the logic, who was seen lately, the presets, the model."""

    def __init__(self, chat: ChatPage, presence: Presence, presets: dict[str, str], model: ModelInfo, *, sign_in: bool):
        self.chat, self.presence, self.presets, self.model = chat, presence, presets, model
        self.sign_in = sign_in

    def who(self, request: gr.Request) -> User:
        name = getattr(request, "username", None) if self.sign_in else None
        try:
            user = self.chat.user(name)
        except Exception:  # (what failed is the server's to log, not the page's to show)
            log.warning("page: signed-in user %r not found", name, exc_info=True)
            raise PageError("You are signed out now (your account changed or was removed): sign in again.") from None
        self.presence.seen(user.name)
        return user

    def preset_of(self, text: str) -> str:
        if not text:
            return NO_PROMPT
        return next((name for name, body in self.presets.items() if body == text), CUSTOM)

    def listed(
        self, user: User, query: str, current: int | None, found: list[tuple[str, int]] | None = None
    ) -> gr.Radio:
        """The sidebar's list (every chat, or what the search found), the one in view selected
        when it is listed."""
        found = self.chat.find(user, query) if found is None else found
        return gr.Radio(choices=found, value=current if current in {i for _, i in found} else None)

    @staticmethod
    def action(writing: bool) -> gr.Button:
        """The one Send/Stop button, as it reads for a chat: Stop while a reply is written there."""
        return gr.Button(STOP if writing else SEND, variant="stop" if writing else "primary")

    @staticmethod
    def link_of(token: str | None, request: gr.Request) -> str:
        """The link on the request's own host: what the owner's browser reached is what
        another browser on the LAN can reach too."""
        if not token:
            return ""
        host = request.headers.get("host") or "localhost"
        return shared_link(f"http://{host}", token)

    def note_of(self, model: str) -> str:
        """The line under the model picker for the served model `model`."""
        return pick_note(self.chat.loaded_info(model))

    def slider_of(self, model: str) -> gr.Slider:
        """The temperature slider's label for `model` (its value is the user's, kept as it is)."""
        return gr.Slider(label=temperature_label(self.chat.loaded_info(model)))

    def shown(self, user: User, conv_id: int | None, query: str, view: View, request: gr.Request) -> Shown:
        """Everything that changes when a chat comes into view (`SHOWN`); an edit ends, and a
        new chat's pick."""
        view.conv, view.editing, view.model, view.title = conv_id, None, None, ""
        if conv_id is None:
            first = self.chat.first_model()
            return (
                None,
                self.listed(user, query, None),
                [],
                "",
                "",
                NO_PROMPT,
                self.action(False),
                "",
                gr.Row(visible=False),
                first,
                self.note_of(first),
                self.slider_of(first),
            )
        conv = self.chat.conversation(user, conv_id)
        model = self.chat.model_of(conv)
        view.title = conv.title
        return (
            conv_id,
            self.listed(user, query, conv_id),
            self.chat.messages(user, conv_id),
            conv.title,
            conv.system_prompt,
            self.preset_of(conv.system_prompt),
            self.action(self.chat.writing(user, conv_id)),
            self.link_of(self.chat.share_token(user, conv_id), request),
            gr.Row(visible=False),
            model,
            self.note_of(model),
            self.slider_of(model),
        )
