"""The chat page: a sidebar of one's chats (a drawer on a phone), streaming replies, and a Server tab.

Layout and wiring only. What the buttons do is webui/page/logic.py (the chats, replies, stop,
errors as sentences); the Server tab's figures are webui/page/dashboard.py. webui/server.py
mounts the page at "/" behind Gradio's sign-in, checked against the store's users, with the
sign-in page's words from `sign_in_message`. "Sign out" is Gradio's /logout in the same tab;
a tab whose sign-in ended elsewhere goes to the sign-in page (webui/page/signed_out.py).
Nothing the page shows is fetched from elsewhere: system fonts, messages as text, code and
links (webui/page/markup.py), and a Content-Security-Policy (webui/page/csp.py).

The sidebar (Gradio's `Sidebar`: beside the chat on a wide screen, a drawer over it at 768 px
and less, closed there until its button opens it) holds "New chat", a search over titles and
messages, one's chats newest first, and "Undo delete" for a few seconds after a delete. Which
chat is in view is the hidden `current` (None: a new chat, made by its first message), set in
the browser the moment a chat is picked or "New chat" pressed, so a message sent right after
goes where the person sees it; the server's `View` follows, each change stamped by the
browser's count (`epoch`) so that a late one never undoes a newer one. A reply keeps streaming
when its chat is left; the chat area shows it only while that chat is in view. One button
sends, and reads "Stop" while a reply is being written in the chat in view (`action`). Export
downloads the chat as the store exports it: the text comes through the page's own queue, and
the browser saves it (`SAVE`), since the gate (webui/gate.py) serves no files. "Share" shows
the chat's read-only link on the request's own host (webui/page/shared.py serves it); "Stop
sharing" ends it. The temperature starts at the model card's recommendation, or 0 (greedy)
for a model without one. Under a message, "‹ i/n ›" and "Edit" (webui/page/versions.py) reach
the server through a hidden button the browser presses (`versions_go`): another version comes
into view, or the message's text goes into the box with a bar saying Send makes a new version
of it (`View.editing`, ended by Send, Cancel or any change of view).

Runs on the server's event loop (the page's async handlers) and Gradio's worker threads
(the others); the few lines of JavaScript run in the browser. No MLX here.
"""

from __future__ import annotations

import asyncio
import functools
import html
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import gradio as gr

from radixchat import assets
from radixchat.webui.page import versions
from radixchat.webui.page.dashboard import Presence, dashboard
from radixchat.webui.page.logic import ChatPage, PageError
from radixchat.webui.page.shared import link as shared_link

if TYPE_CHECKING:
    from radixchat.core.config import Settings
    from radixchat.core.engine.seam import EngineClient
    from radixchat.core.store import Store
    from radixchat.webui.api.metrics import Metrics

log = logging.getLogger("radixchat.page")

SYSTEM_FONTS = ["system-ui", "-apple-system", "Segoe UI", "Roboto", "Helvetica Neue", "Arial", "sans-serif"]
MONO_FONTS = ["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "Liberation Mono", "monospace"]
NO_PROMPT, CUSTOM = "None", "Custom"
REFRESH_S = 3.0  # the Server tab's refresh, while it is open
SEND, STOP = "Send", "Stop"
# the browser saves an export handed to it as {name, type, text}; "" is nothing to save
SAVE = """(payload) => {
  if (!payload) return [];
  const file = JSON.parse(payload);
  const url = URL.createObjectURL(new Blob([file.text], {type: file.type}));
  const a = document.createElement("a");
  a.href = url;
  a.download = file.name;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
  return [];
}"""
MEDIA_TYPES = {"md": "text/markdown", "json": "application/json"}
UNDO_S = 10.0  # how long "Undo delete" is offered (the store keeps a deleted chat longer)
# Gradio's sidebar is a drawer over the whole page at this width and less (its own CSS)
DRAWER_PX = 768
_DRAWER = f"""const s = document.querySelector('#sidebar');
  const open = !!s && s.classList.contains('open');
  const want = window.innerWidth > {DRAWER_PX};"""
# beside the chat on a wide screen; on a phone a drawer that starts closed
OPEN_WIDE = f"() => {{ {_DRAWER} if (s && open !== want) s.querySelector('.toggle-button').click(); }}"
_CLOSE_ON_PHONE = f"{{ {_DRAWER} if (open && !want) s.querySelector('.toggle-button').click(); }}"
# in the browser, at once: a new chat is in view (current None), the next view change is counted
NEW_CHAT = f"""(n) => {{ {_CLOSE_ON_PHONE}
  document.querySelector('#message textarea')?.focus();
  return [null, null, [], "", "", "{NO_PROMPT}", "", (n || 0) + 1]; }}"""
PICK = f"(picked, n) => {{ {_CLOSE_ON_PHONE} return [picked, (n || 0) + 1]; }}"

CSS = """
#conv-list .wrap { flex-direction: column; flex-wrap: nowrap; gap: 2px; }
#conv-list label { width: 100%; max-width: 100%; box-sizing: border-box; margin: 0; padding: 6px 10px;
  border: none; border-radius: 6px; background: transparent; box-shadow: none; }
/* a chat's title, or a search hit's title and matching text, in at most two lines */
#conv-list label span { overflow: hidden; overflow-wrap: anywhere; display: -webkit-box;
  -webkit-line-clamp: 2; -webkit-box-orient: vertical; }
#conv-list label:hover { background: var(--background-fill-primary); }
#conv-list label.selected { background: var(--background-fill-primary); font-weight: 600;
  box-shadow: inset 3px 0 0 var(--color-accent); }
#conv-list input[type=radio] { display: none; }
#compose { flex-wrap: nowrap; align-items: end; }
#compose #send { flex: 0 0 auto; min-width: 72px; }
#top-row { align-items: center; }
#chat button[aria-label="Clear"] { display: none; }
.rc-stats { font-size: 0.8em; opacity: 0.7; }
/* under a message: ‹ i/n › between its versions, and Edit; big enough to tap on a phone */
.rc-branch { display: inline-flex; align-items: center; gap: 2px; font-size: 0.85em; opacity: 0.8; }
.rc-branch a, .rc-branch .rc-off { padding: 2px 8px; text-decoration: none; }
.rc-branch .rc-off { opacity: 0.35; }
.rc-branch .rc-count { padding: 0 2px; font-variant-numeric: tabular-nums; }
#edit-bar { align-items: center; flex-wrap: nowrap; }
/* the Server tab's row names break between words, not inside them, on a phone */
:is(#server-summary, #your-usage) :is(th, td) { overflow-wrap: normal; word-break: normal; }
/* a phone: the message box and Send stay on screen under a shorter chat area, and room is
   left on the left for the drawer's button */
@media (max-width: 768px) {
  #chat { height: max(200px, calc(100dvh - 330px)) !important; }
  #top-row { padding-left: 28px; }
}
"""


def theme() -> gr.themes.Base:
    """Gradio's default look with the system's fonts: nothing is fetched from elsewhere."""
    return gr.themes.Default(font=SYSTEM_FONTS, font_mono=MONO_FONTS)


def model_facts(model) -> str:
    """What the model's card says of its size and license, e.g. "135M parameters, Apache-2.0"."""
    card = model.card
    return ", ".join(x for x in (card.size, card.license) if x) if card else ""


def sign_in_message(model) -> str:
    """The sign-in page's words (HTML, shown by Gradio above the form): the server, the model
    it serves, and how to get a user."""
    facts = model_facts(model)
    served = f"<code>{html.escape(model.model_id)}</code>" + (f" ({html.escape(facts)})" if facts else "")
    return (
        f"This is <strong>radixchat</strong>, serving {served}.<br>"
        "Sign in with your radixchat user. No user yet? Whoever runs the server adds one "
        "with <code>radixchat users add NAME</code>."
    )


def load_presets(path: Path | None = None) -> dict[str, str]:
    """System-prompt presets by name: the bundled ones, or those of a prompts.json at `path`."""
    try:
        data = assets.prompts() if path is None else json.loads(path.read_text())
        return {p["name"]: p["text"] for p in data["system_prompts"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("no system-prompt presets from %s: %s", path, e)
        return {}


@dataclass
class View:
    """Per browser session: the conversation the chat area shows (None: a new chat), the
    browser's count of view changes it follows (`epoch`), the chat "Undo delete" brings back,
    and the message being edited (its "Edit" was pressed: the next Send makes a new version of
    it), as (conversation, message); any change of view ends the edit."""

    conv: int | None = None
    epoch: int = 0
    deleted: int | None = None
    editing: tuple[int, int] | None = None

    def follow(self, conv: int | None, epoch: int | float | None, *, change: bool = False) -> bool:
        """Show `conv` unless the browser has changed its view since (a later epoch). A view
        change (`change`: a pick, "New chat") counts only if it is newer than what is shown: a
        message sent to a new chat made it under the same epoch, and stays in view."""
        epoch = int(epoch or 0)
        if epoch < self.epoch or (change and epoch == self.epoch):
            return False
        self.epoch, self.conv = epoch, conv
        return True


def notice(e: PageError) -> None:
    """A PageError as a notice. Gradio shows a notice's text as (sanitized) HTML; escaped, it
    is text, whatever of a request or a reply it quotes."""
    gr.Warning(html.escape(e.message))


def _notices(n_outputs: int):
    """Turn a PageError into a notice on the page, leaving the outputs as they are."""

    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except PageError as e:
                notice(e)
                skip = tuple(gr.skip() for _ in range(n_outputs))
                return skip[0] if n_outputs == 1 else skip

        return inner

    return wrap


def build_page(
    engine: EngineClient, settings: Settings, store: Store, metrics: Metrics | None = None, *, sign_in: bool = True
) -> gr.Blocks:
    model = engine.info
    chat = ChatPage(
        engine, store, metrics, model_id=model.model_id, default_max_tokens=settings.max_tokens, signed_in=sign_in
    )
    presence = Presence()
    presets = load_presets()

    def who(request: gr.Request):
        name = getattr(request, "username", None) if sign_in else None
        try:
            user = chat.user(name)
        except Exception as e:
            raise PageError(f"Signed-in user {name!r} is unknown now; sign in again ({e}).") from None
        presence.seen(user.name)
        return user

    def preset_of(text: str) -> str:
        if not text:
            return NO_PROMPT
        return next((name for name, body in presets.items() if body == text), CUSTOM)

    def listed(user, query: str, current: int | None, found: list[tuple[str, int]] | None = None):
        """The sidebar's list (every chat, or what the search found), the one in view selected
        when it is listed."""
        found = chat.find(user, query) if found is None else found
        return gr.Radio(choices=found, value=current if current in {i for _, i in found} else None)

    def action(writing: bool):
        """The one Send/Stop button, as it reads for a chat: Stop while a reply is written there."""
        return gr.Button(STOP if writing else SEND, variant="stop" if writing else "primary")

    def link_of(token: str | None, request: gr.Request) -> str:
        """The link on the request's own host: what the owner's browser reached is what
        another browser on the LAN can reach too."""
        if not token:
            return ""
        host = request.headers.get("host") or "localhost"
        return shared_link(f"http://{host}", token)

    def shown(user, conv_id: int | None, query: str, view: View, request: gr.Request):
        """Everything that changes when a chat comes into view (`view_outputs`); an edit ends."""
        view.conv, view.editing = conv_id, None
        if conv_id is None:
            return (None, listed(user, query, None), [], "", "", NO_PROMPT, action(False), "", gr.Row(visible=False))
        conv = chat.conversation(user, conv_id)
        return (
            conv_id,
            listed(user, query, conv_id),
            chat.messages(user, conv_id),
            conv.title,
            conv.system_prompt,
            preset_of(conv.system_prompt),
            action(chat.writing(user, conv_id)),
            link_of(chat.share_token(user, conv_id), request),
            gr.Row(visible=False),
        )

    # which model answers, as its card says (core.engine.catalog)
    card = model.card
    recommended = dict(card.sampling) if card else {}
    facts = model_facts(model)
    model_line = f"`{model.model_id}`" + (f" ({facts})" if facts else "")
    note_line = (f"  \n*{card.note}*" if card and card.note else "") + (
        f" Its card: `{card.link}` in radixchat's repository." if card and card.link else ""
    )
    temperature_label = "Temperature" + (
        f" (model card: {recommended['temperature']:g}"
        + (f"; top-p {recommended['top_p']:g}" if "top_p" in recommended else "")
        + ")"
        if "temperature" in recommended
        else ""
    )

    with gr.Blocks(title="radixchat", analytics_enabled=False) as page:
        view = gr.State(View())
        # the chat in view (None: a new chat) and the browser's count of view changes: set in the
        # browser at once (NEW_CHAT, PICK), read by every event that acts on "this chat"
        current = gr.Number(None, precision=0, visible=False, elem_id="current")
        epoch = gr.Number(0, precision=0, visible=False, elem_id="epoch")
        # closed at first: OPEN_WIDE opens it beside the chat on a wide screen, a phone keeps the page
        with gr.Sidebar(open=False, width=280, elem_id="sidebar"):
            new = gr.Button("New chat", variant="primary", size="sm", elem_id="new-chat")
            search = gr.Textbox(
                placeholder="Search your chats", show_label=False, container=False, max_lines=1, elem_id="search"
            )
            undo = gr.Button("Undo delete", size="sm", visible=False, elem_id="undo")
            conv_list = gr.Radio(show_label=False, container=False, elem_id="conv-list")
            undo_timer = gr.Timer(UNDO_S, active=False)
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
        with gr.Tabs():
            with gr.Tab("Chat", id="chat") as chat_section, gr.Row():
                with gr.Column(scale=4):
                    # messages arrive as Markdown whose HTML is text (logic.row, markup.py); the
                    # sanitizer stays on behind that, custom tags are not let through, and LaTeX
                    # is off: its renderer pastes text into the page as HTML
                    chatbot = gr.Chatbot(
                        show_label=False,
                        elem_id="chat",
                        height=540,
                        buttons=["copy"],
                        feedback_options=None,
                        sanitize_html=True,
                        render_markdown=True,
                        allow_tags=False,
                        latex_delimiters=[],
                        placeholder="Replies stream here, with time to first token, "
                        "tokens/s and cached prompt tokens under each.",
                    )
                    # after "Edit" under a message: its text is in the box, Send makes a new version
                    with gr.Row(visible=False, elem_id="edit-bar") as edit_bar:
                        gr.Markdown(
                            "Editing a sent message: **Send** makes a new version of it (the old one stays, ‹ 1/2 ›).",
                            elem_id="edit-note",
                        )
                        cancel_edit = gr.Button("Cancel", size="sm", scale=0, min_width=80, elem_id="cancel-edit")
                    # one row that never wraps, so Send/Stop stays beside the box on a phone
                    with gr.Row(elem_id="compose"):
                        message = gr.Textbox(
                            placeholder="Message (Enter sends, Shift+Enter: new line)",
                            show_label=False,
                            lines=1,
                            max_lines=10,
                            scale=8,
                            elem_id="message",
                            autofocus=True,
                            min_width=0,
                        )
                        send = gr.Button(SEND, variant="primary", scale=0, min_width=72, elem_id="send")
                    with gr.Row():
                        regenerate = gr.Button("Regenerate", size="sm", elem_id="regenerate")
                    # pressed by the browser (versions.LISTEN) for a click on ‹ › or Edit in a message
                    versions_go = gr.Button(visible="hidden", elem_id="versions-go")
                    asked = gr.Textbox(visible=False, elem_id="versions-asked")
                with gr.Column(scale=1, min_width=260):
                    with gr.Accordion("This chat", open=True):
                        title = gr.Textbox(label="Title", max_lines=1, elem_id="title")
                        with gr.Row():
                            rename = gr.Button("Rename", size="sm", elem_id="rename")
                            delete = gr.Button("Delete", size="sm", variant="stop", elem_id="delete")
                        with gr.Row():
                            export_md = gr.Button("Export Markdown", size="sm", elem_id="export-md")
                            export_json = gr.Button("Export JSON", size="sm", elem_id="export-json")
                        exported = gr.Textbox(visible=False, elem_id="exported")
                        with gr.Row():
                            share = gr.Button("Share", size="sm", elem_id="share")
                            unshare = gr.Button("Stop sharing", size="sm", elem_id="unshare")
                        # the read-only link (webui/page/shared.py), for signed-in users here
                        share_link = gr.Textbox(
                            label="Read-only link for users of this server",
                            interactive=False,
                            max_lines=1,
                            elem_id="share-link",
                            placeholder="Not shared",
                            buttons=["copy"],
                        )
                    with gr.Accordion("Settings", open=True):
                        preset = gr.Dropdown(
                            [NO_PROMPT, *presets, CUSTOM], value=NO_PROMPT, label="System prompt", elem_id="preset"
                        )
                        system = gr.Textbox(label="System prompt of this chat", lines=3, max_lines=12, elem_id="system")
                        temperature = gr.Slider(
                            0,
                            2,
                            value=recommended.get("temperature", 0.0),
                            step=0.05,
                            label=temperature_label,
                            elem_id="temperature",
                        )
                        max_tokens = gr.Slider(
                            1,
                            model.context_length,
                            value=settings.max_tokens,
                            step=1,
                            label="Max tokens",
                            elem_id="max-tokens",
                        )
            with gr.Tab("Server", id="server") as server_section:
                summary = gr.Markdown(elem_id="server-summary")
                usage = gr.Markdown(elem_id="your-usage")
                with gr.Row():
                    requests_plot = gr.BarPlot(
                        x="time",
                        y="count",
                        color="series",
                        y_title="requests",
                        label="Requests per minute (last hour)",
                        elem_id="requests-plot",
                    )
                    ttft_plot = gr.ScatterPlot(
                        x="time",
                        y="ms",
                        color="series",
                        y_title="ms",
                        label="Time to first token per minute (last hour)",
                        elem_id="ttft-plot",
                    )
                timer = gr.Timer(REFRESH_S, active=False)

        view_outputs = [current, conv_list, chatbot, title, system, preset, send, share_link, edit_bar]

        @_notices(1 + len(view_outputs))
        def on_load(view: View, request: gr.Request):
            user = who(request)
            who_line = (
                f"signed in as **{user.name}**" if sign_in else "no sign-in: everyone here is the same local user"
            )
            head = f"**radixchat** · {model_line} · {who_line}{note_line}"
            return (head, *shown(user, chat.start(user), "", view, request))

        @_notices(len(view_outputs))
        def switch(conv_id, stamp, query, view: View, request: gr.Request):
            """A chat picked in the sidebar (the browser already set `current`)."""
            user = who(request)
            if conv_id is None:
                return tuple(gr.skip() for _ in view_outputs)
            conv = chat.show(user, int(conv_id))  # someone else's: "not found", and nothing changes
            if not view.follow(conv.id, stamp, change=True):
                return tuple(gr.skip() for _ in view_outputs)
            return shown(user, conv.id, query, view, request)

        def new_chat_opened(stamp, view: View):
            """ "New chat" (the browser already shows it): its reply, if any, stops being drawn here."""
            view.follow(None, stamp, change=True)
            view.editing = None
            return action(False), gr.Row(visible=False)

        @_notices(3)
        def version_asked(what, conv_id, view: View, request: gr.Request):
            """‹ › or Edit pressed in a message of the chat in view (versions.LISTEN): another
            version comes into view, or the message's text goes into the box to be sent again."""
            user, picked = who(request), versions.parse(what)
            if picked is None or conv_id is None:
                return gr.skip(), gr.skip(), gr.skip()
            kind, message_id = picked
            conv_id = int(conv_id)
            if kind == versions.SHOW:
                rows = chat.show_version(user, conv_id, message_id)
                was_editing, view.editing = view.editing, None  # the edited text goes with its edit
                return rows, "" if was_editing else gr.skip(), gr.Row(visible=False)
            text = chat.edit_text(user, conv_id, message_id)
            view.editing = (conv_id, message_id)
            return gr.skip(), text, gr.Row(visible=True)

        def edit_cancelled(view: View):
            view.editing = None
            return "", gr.Row(visible=False)

        @_notices(1)
        def find(query, conv_id, request: gr.Request):
            return listed(who(request), query, conv_id)

        @_notices(2)
        def rename_chat(conv_id, new_title, query, request: gr.Request):
            user = who(request)
            conv = chat.rename(user, conv_id, new_title)
            return listed(user, query, conv.id), conv.title

        @_notices(len(view_outputs) + 2)
        def delete_chat(conv_id, query, view: View, request: gr.Request):
            """Delete the chat in view: a new chat comes into view, and "Undo delete" for UNDO_S."""
            user = who(request)
            gone = chat.delete(user, conv_id)
            view.deleted = gone.id
            gr.Info(
                f"Deleted “{html.escape(gone.title)}”. “Undo delete” in the list brings it back for {UNDO_S:g} seconds."
            )
            return (*shown(user, None, query, view, request), gr.Button(visible=True), gr.Timer(active=True))

        @_notices(len(view_outputs) + 2)
        def undo_delete(query, view: View, request: gr.Request):
            user = who(request)
            back = chat.undo_delete(user, view.deleted)
            view.deleted = None
            chat.show(user, back.id)
            return (*shown(user, back.id, query, view, request), gr.Button(visible=False), gr.Timer(active=False))

        def undo_expired(view: View):
            view.deleted = None
            return gr.Button(visible=False), gr.Timer(active=False)

        @_notices(1)
        def apply_preset(name, conv_id, request: gr.Request):
            text = presets.get(name, "") if name != CUSTOM else gr.skip()
            if name != CUSTOM and conv_id is not None:  # a new chat takes it with its first message
                chat.set_system_prompt(who(request), int(conv_id), text)
            return text

        @_notices(1)
        def save_system(text, conv_id, request: gr.Request):
            if conv_id is not None:
                chat.set_system_prompt(who(request), int(conv_id), text)
            return preset_of(text)

        async def send_message(
            text, conv_id, system_text, stamp, query, temp, n_tokens, view: View, request: gr.Request, again=False
        ):
            """Stream a reply into the chat area while its chat is in view (outputs: `replying`). A
            refusal leaves the typed text in the box and shows a notice. A new chat (conv_id None)
            is made by this message, and shown with it unless the browser moved on meanwhile.
            After "Edit" in this chat the message is a new version of the one edited; the edit
            ends once it is stored (a refusal keeps it)."""
            skip = gr.skip()
            try:
                user = await asyncio.to_thread(who, request)
                conv_id = None if conv_id is None else int(conv_id)
                if conv_id is not None:
                    view.follow(conv_id, stamp)
                editing = view.editing
                edit = editing[1] if editing and not again and editing[0] == conv_id else None
                made: list[int] = []

                def started(new_id: int):
                    made.append(new_id)
                    view.follow(new_id, stamp)

                first, visible, reads_stop = True, True, None

                def button():
                    """The button for the chat in view, when that changed: this reply began or ended,
                    or another chat (writing or not) came into view meanwhile."""
                    nonlocal reads_stop
                    writing = chat.writing(user, view.conv)
                    if writing == reads_stop:
                        return skip
                    reads_stop = writing
                    return action(writing)

                async for msgs in chat.reply(
                    user,
                    conv_id,
                    text,
                    temperature=temp,
                    max_tokens=n_tokens,
                    regenerate=again,
                    edit=edit,
                    system_prompt=system_text or "",
                    started=started,
                ):
                    conv_id = made[0] if made else conv_id
                    here = view.conv == conv_id
                    if first:  # the list and title, for the title a first message gives its chat
                        found = await asyncio.to_thread(chat.find, user, query)
                        title_now = (await asyncio.to_thread(chat.conversation, user, conv_id)).title if here else skip
                        ended = skip
                        if edit is not None and view.editing == editing:  # stored: the edit is done
                            view.editing, ended = None, gr.Row(visible=False)
                        yield (
                            msgs if here else skip,
                            skip if again else "",
                            listed(user, query, view.conv, found),
                            title_now if here else skip,
                            button(),
                            conv_id if here and made else skip,
                            ended,
                        )
                        visible, first = here, False
                    elif here:
                        visible = True
                        yield msgs, skip, skip, skip, button(), skip, skip
                    elif visible:  # its chat was left: make sure the chat area shows the one in view
                        visible = False
                        try:
                            other = await asyncio.to_thread(chat.messages, user, view.conv)
                        except PageError:
                            other = skip
                        yield other, skip, skip, skip, button(), skip, skip
                if not first:  # ended: the chat in view reads Send again, unless it writes too
                    yield skip, skip, skip, skip, button(), skip, skip
            except PageError as e:
                notice(e)
                yield skip, skip, skip, skip, skip, skip, skip  # refused before it began, or after its last yield

        async def respond_again(conv_id, stamp, query, temp, n_tokens, view: View, request: gr.Request):
            async for out in send_message(None, conv_id, "", stamp, query, temp, n_tokens, view, request, again=True):
                yield out

        async def send_pressed(
            label, text, conv_id, system_text, stamp, query, temp, n_tokens, view: View, request: gr.Request
        ):
            """The button read Send when pressed: send (Stop is `stop_pressed`, outside the queue)."""
            if label == STOP:
                yield tuple(gr.skip() for _ in range(7))
                return
            async for out in send_message(text, conv_id, system_text, stamp, query, temp, n_tokens, view, request):
                yield out

        # Scripted clients of the page's queue (loadtests/page_user.py, tests) speak an older, shorter
        # form: `new_tab` makes a chat with a system prompt (its id is the value of the first output),
        # `respond` sends in a chat by id (None: a new chat). No browser triggers these two.
        @_notices(len(view_outputs))
        def new_tab(system_text, view: View, request: gr.Request):
            user = who(request)
            conv = chat.new_chat(user, system_text or "", reuse=False)  # sessions of one user each get theirs
            chat.show(user, conv.id)
            current_id, chats, *rest = shown(user, conv.id, "", view, request)
            return (chats, current_id, *rest)

        async def respond(text, conv_id, temp, n_tokens, view: View, request: gr.Request):
            async for out in send_message(text, conv_id, "", view.epoch, "", temp, n_tokens, view, request):
                yield out

        @_notices(1)
        def stop_pressed(label, conv_id, request: gr.Request):
            """The button read Stop when pressed: cancel the chat's reply in the engine (what it wrote
            stays; its own event turns the button back to Send). Not queued behind the replies."""
            if label != STOP:
                return gr.skip()
            if conv_id is None or not chat.stop(who(request), int(conv_id)):
                return action(False)  # it ended meanwhile
            return gr.skip()

        def export(fmt: str):
            def export_tab(conv_id, request: gr.Request):
                """The chat as the store exports it, for the browser to save (SAVE)."""
                try:
                    name, text = chat.export(who(request), None if conv_id is None else int(conv_id), fmt)
                except PageError as e:
                    notice(e)
                    return ""  # nothing to save, whatever an earlier export left here
                return json.dumps({"name": name, "type": MEDIA_TYPES[fmt], "text": text})

            export_tab.__name__ = f"export_{fmt}"
            return export_tab

        @_notices(1)
        def share_tab(conv_id, request: gr.Request):
            return link_of(chat.share(who(request), None if conv_id is None else int(conv_id)), request)

        @_notices(1)
        def unshare_tab(conv_id, request: gr.Request):
            chat.unshare(who(request), None if conv_id is None else int(conv_id))
            gr.Info('Stopped sharing: the link now shows "not found".')
            return ""

        @_notices(4)
        def refresh(request: gr.Request):
            you = who(request)  # an open Server tab counts as being signed in
            d = dashboard(engine, store, presence, you=you)
            # both plots span the whole window their titles name, points or not
            return (
                d.summary,
                d.usage,
                gr.BarPlot(d.requests, x_lim=list(d.x_lim)),
                gr.ScatterPlot(d.ttft, x_lim=list(d.x_lim)),
            )

        private = {"api_visibility": "private"}
        generating = {
            "concurrency_id": "generate",
            "show_progress": "hidden",
            "trigger_mode": "multiple",
            "concurrency_limit": max(settings.max_batch, settings.max_queue),
            **private,
        }
        page.load(on_load, [view], [header, *view_outputs], **private)
        page.load(None, js=OPEN_WIDE, **private)
        page.load(None, js=versions.LISTEN, **private)
        # ‹ › or Edit in a message: the browser hands over what was clicked, then the server acts
        versions_go.click(None, None, [asked], js=versions.ASKED, **private).then(
            version_asked, [asked, current, view], [chatbot, message, edit_bar], **private
        )
        cancel_edit.click(edit_cancelled, [view], [message, edit_bar], **private)
        # a chat picked or "New chat": the browser changes its view at once, then the server follows
        conv_list.input(None, [conv_list, epoch], [current, epoch], js=PICK, **private).then(
            switch, [current, epoch, search, view], view_outputs, **private
        )
        new.click(
            None,
            [epoch],
            [current, conv_list, chatbot, title, system, preset, share_link, epoch],
            js=NEW_CHAT,
            **private,
        ).then(new_chat_opened, [epoch, view], [send, edit_bar], **private)
        search.change(find, [search, current], [conv_list], show_progress="hidden", **private)
        gr.on([rename.click, title.submit], rename_chat, [current, title, search], [conv_list, title], **private)
        delete.click(delete_chat, [current, search, view], [*view_outputs, undo, undo_timer], **private)
        undo.click(undo_delete, [search, view], [*view_outputs, undo, undo_timer], **private)
        undo_timer.tick(undo_expired, [view], [undo, undo_timer], show_progress="hidden", **private)
        preset.input(apply_preset, [preset, current], [system], **private)
        system.blur(save_system, [system, current], [preset], **private)
        replying = [chatbot, message, conv_list, title, send, current, edit_bar]
        asked = [current, system, epoch, search, temperature, max_tokens, view]
        message.submit(send_message, [message, *asked], replying, **generating)
        # one click, two events: each acts only if the button read its word when pressed
        send.click(send_pressed, [send, message, *asked], replying, **generating)
        send.click(stop_pressed, [send, current], [send], concurrency_limit=None, show_progress="hidden", **private)
        regenerate.click(respond_again, [current, epoch, search, temperature, max_tokens, view], replying, **generating)
        scripted = gr.Button(visible=False)
        scripted.click(new_tab, [system, view], [conv_list, current, *view_outputs[2:]], **private)
        scripted.click(respond, [message, current, temperature, max_tokens, view], replying, **generating)
        for button, fmt in ((export_md, "md"), (export_json, "json")):
            button.click(export(fmt), [current], [exported], **private).then(None, [exported], None, js=SAVE, **private)
        share.click(share_tab, [current], [share_link], **private)
        unshare.click(unshare_tab, [current], [share_link], **private)
        server_view = [summary, usage, requests_plot, ttft_plot]
        server_section.select(lambda: gr.Timer(active=True), None, timer, **private).then(
            refresh, None, server_view, **private
        )
        chat_section.select(lambda: gr.Timer(active=False), None, timer, **private)
        timer.tick(refresh, None, server_view, show_progress="hidden", **private)
    page.queue(default_concurrency_limit=settings.max_batch)
    return page
