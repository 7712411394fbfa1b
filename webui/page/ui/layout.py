"""The chat page: a sidebar of one's chats (a drawer on a phone), streaming replies, and a Server tab.

`build_page` describes the page part by part and hands the parts to the wiring. The parts:
the sidebar (webui/page/ui/sidebar.py), the chat area (chat_panel.py) and the panel beside it
(chat_settings.py), the Server tab (server_tab.py); what their events do is
webui/page/events/handlers.py and sending.py, over the logic of webui/page/logic/chat_page.py (the chats,
replies, stop, errors as sentences); which event calls what is webui/page/events/wiring.py; the look
is webui/page/ui/style.py. webui/server.py mounts the page at "/" behind Gradio's sign-in,
checked against the store's users, with the sign-in page's words from `sign_in_message`.
"Sign out" is Gradio's /logout in the same tab; a tab whose sign-in ended elsewhere goes to
the sign-in page (webui/page/routes/signed_out.py). Nothing the page shows is fetched from
elsewhere: system fonts, messages as text, code and links (webui/page/logic/markup.py), and a
Content-Security-Policy (webui/page/routes/csp.py).

The sidebar holds "New chat", a search over titles and messages, one's chats newest first,
and "Undo delete" for a few seconds after a delete. Which chat is in view is the hidden
`current` (None: a new chat, made by its first message), set in the browser the moment a chat
is picked or "New chat" pressed, so a message sent right after goes where the person sees it;
the server's `View` follows, each change stamped by the browser's count (`epoch`) so that a
late one never undoes a newer one. A reply keeps streaming when its chat is left; the chat
area shows it only while that chat is in view. One button sends, and reads "Stop" while a
reply is being written in the chat in view. Export downloads the chat as the store exports
it: the text comes through the page's own queue, and the browser saves it
(webui/page/ui/scripts.py), since the gate (webui/auth/gate.py) serves no files. "Share" shows the
chat's read-only link on the request's own host (webui/page/routes/shared.py serves it); "Stop
sharing" ends it. When the server serves several models, "Model" at the top of "Settings"
picks the one the chat in view chats with from its next reply on (a new chat's, for its first
message; webui/page/logic/model_pick.py), and the line under it says what that model is and whether
it is loaded. The temperature starts at the first model's card's recommendation, or 0 (greedy)
for a model without one. Under a message, "‹ i/n ›" and "Edit" (webui/page/logic/versions.py)
reach the server through a hidden button the browser presses (`versions_go`): another
version comes into view, or the message's text goes into the box with a bar saying Send
makes a new version of it (`View.editing`, ended by Send, Cancel or any change of view).

Runs on the server's event loop (the page's async handlers) and Gradio's worker threads
(the others); the few lines of JavaScript run in the browser. No MLX here.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import gradio as gr

from radixchat import assets
from radixchat.webui.page.events.accounts_handlers import AccountHandlers
from radixchat.webui.page.events.handlers import Handlers
from radixchat.webui.page.events.view import View
from radixchat.webui.page.events.wiring import Parts, wire
from radixchat.webui.page.logic.chat_page import ChatPage
from radixchat.webui.page.logic.dashboard import Presence
from radixchat.webui.page.logic.model_card import sign_in_message
from radixchat.webui.page.ui import account_tab, admin_tab
from radixchat.webui.page.ui.chat_panel import chat_area
from radixchat.webui.page.ui.chat_settings import chat_settings
from radixchat.webui.page.ui.server_tab import server_tab
from radixchat.webui.page.ui.sidebar import UNDO_S, sidebar
from radixchat.webui.page.ui.style import CSS, theme

if TYPE_CHECKING:
    from radixchat.core.config import Settings
    from radixchat.core.seam.protocol import EngineClient, Engines
    from radixchat.core.store import Store
    from radixchat.webui.api.metrics import Metrics
    from radixchat.webui.live_requests import LiveRequests

# what webui/server.py and the tests import from here
__all__ = ["CSS", "UNDO_S", "View", "build_page", "load_presets", "sign_in_message", "theme"]

log = logging.getLogger("radixchat.page")


def load_presets(path: Path | None = None) -> dict[str, str]:
    """System-prompt presets by name: the bundled ones, or those of a prompts.json at `path`."""
    try:
        data = assets.prompts() if path is None else json.loads(path.read_text())
        return {p["name"]: p["text"] for p in data["system_prompts"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("no system-prompt presets from %s: %s", path, e)
        return {}


def build_page(
    engines: Engines | EngineClient,
    settings: Settings,
    store: Store,
    metrics: Metrics | None = None,
    *,
    sign_in: bool = True,
    live: LiveRequests | None = None,
) -> gr.Blocks:
    chat = ChatPage(engines, store, metrics, default_max_tokens=settings.max_tokens, signed_in=sign_in, live=live)
    model = chat.engine.info  # the first model's: the header, the temperature's start
    presets = load_presets()
    handlers = Handlers(chat, Presence(), presets, model, sign_in=sign_in)

    page: gr.Blocks  # what `with` gives: the Blocks itself (Gradio leaves __enter__ unannotated)
    with gr.Blocks(title="radixchat", analytics_enabled=False) as page:
        view = gr.State(View())
        # the chat in view (None: a new chat) and the browser's count of view changes: set in the
        # browser at once (NEW_CHAT, PICK), read by every event that acts on "this chat"
        current = gr.Number(None, precision=0, visible=False, elem_id="current")
        epoch = gr.Number(0, precision=0, visible=False, elem_id="epoch")
        # set by the page's load: the key the browser keeps this user's settings and drafts under
        browser_key = gr.Textbox("", visible=False, elem_id="browser-key")
        side = sidebar()
        header = top_row(sign_in)
        with gr.Tabs():
            with gr.Tab("Chat", id="chat") as chat_section, gr.Row():
                area = chat_area()
                this, settings_panel = chat_settings(presets, model, settings.max_tokens, chat.model_ids())
            with gr.Tab("Server", id="server") as server_section:
                server = server_tab()
            if sign_in:  # accounts to manage only when people sign in
                accounts = AccountHandlers(store, sign_in=sign_in)
                account_tab.build(accounts)
                admin_tab.build(page, accounts)
        parts = Parts(
            view,
            current,
            epoch,
            header,
            browser_key,
            side,
            area,
            this,
            settings_panel,
            chat_section,
            server_section,
            server,
        )
        wire(page, parts, handlers, settings)
    page.queue(default_concurrency_limit=settings.max_batch)
    slower_idle_poll(page)
    return page


# Gradio's queue has no wake-up: it looks for new events every 1 ms while none waits (and its
# progress loop every 10 ms), which kept an idle server at ~4% of a core
# (loadtests/bench_idle.py). Every 10 ms (100 ms for progress) costs an event at most 10 ms
# before it starts. Its attributes are not public: a Gradio without them keeps its own pace.
IDLE_POLL_S = 0.01
IDLE_PROGRESS_POLL_S = 0.1


def slower_idle_poll(page: gr.Blocks) -> None:
    queue = getattr(page, "_queue", None)
    for name, pause in (("sleep_when_free", IDLE_POLL_S), ("progress_update_sleep_when_free", IDLE_PROGRESS_POLL_S)):
        if isinstance(getattr(queue, name, None), float):
            setattr(queue, name, max(getattr(queue, name), pause))


def top_row(sign_in: bool) -> gr.Markdown:
    """The header (the server, the model, who is signed in) and "Sign out"."""
    with gr.Row(elem_id="top-row", equal_height=True):
        header = gr.Markdown(elem_id="header")
        # a plain link in this tab: /logout ends the session on the server and lands on the
        # sign-in page (a Markdown link would open a new tab and leave this one signed in)
        gr.Button(
            "Sign out",
            link="logout",
            link_target="_self",
            size="sm",
            scale=0,
            min_width=90,
            elem_id="sign-out",
            visible=sign_in,
        )
    return header
