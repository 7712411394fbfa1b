"""The chat page: a tab per open conversation, streaming replies, and a Server tab.

Layout and wiring only. What the buttons do is webui/page/logic.py (tabs, replies, stop,
errors as sentences); the Server tab's figures are webui/page/dashboard.py. webui/server.py
mounts the page at "/" behind Gradio's sign-in, checked against the store's users, with the
sign-in page's words from `sign_in_message`. "Sign out" is Gradio's /logout in the same tab;
a tab whose sign-in ended elsewhere goes to the sign-in page (webui/page/signed_out.py).
Nothing the page shows is fetched from elsewhere: system fonts, messages as text, code and
links (webui/page/markup.py), and a Content-Security-Policy (webui/page/csp.py).

The tab strip is a radio group styled as tabs, one choice per open conversation, over one
chat area. A reply keeps streaming when its tab is left; the chat area shows it only while
its tab is the one in view (`View`, per browser session). One button sends, and reads "Stop"
while a reply is being written in the tab in view (`action`). Export downloads the tab as
the store exports it: the text comes through the page's own queue, and the browser saves it
(`SAVE`), since the gate (webui/gate.py) serves no files. "Share" shows the tab's read-only
link on the request's own host (webui/page/shared.py serves it); "Stop sharing" ends it. The temperature starts at the model
card's recommendation, or 0 (greedy) for a model without one.

Runs on the server's event loop (the page's async handlers) and Gradio's worker threads
(the others). No MLX here.
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

import assets

from webui.page.dashboard import Presence, dashboard
from webui.page.logic import ChatPage, PageError
from webui.page.shared import link as shared_link

if TYPE_CHECKING:
    from core.config import Settings
    from core.engine.engine import Engine
    from core.store import Conversation, Store
    from webui.api.metrics import Metrics

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

CSS = """
#conv-tabs .wrap { gap: 2px; border-bottom: 1px solid var(--border-color-primary); }
#conv-tabs label { border-radius: 8px 8px 0 0; border: 1px solid var(--border-color-primary);
  border-bottom: none; padding: 6px 14px; margin: 0; max-width: 16em; background: var(--background-fill-secondary); }
#conv-tabs label span { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
#conv-tabs label.selected { background: var(--background-fill-primary); font-weight: 600;
  box-shadow: inset 0 2px 0 var(--color-accent); }
#conv-tabs input[type=radio] { display: none; }
#tab-row { align-items: end; gap: 6px; }
#new-tab { max-width: 44px; }
#compose { flex-wrap: nowrap; align-items: end; }
#compose #send { flex: 0 0 auto; min-width: 72px; }
#top-row { align-items: center; }
#chat button[aria-label="Clear"] { display: none; }
.rc-stats { font-size: 0.8em; opacity: 0.7; }
/* the Server tab's row names break between words, not inside them, on a phone */
:is(#server-summary, #your-usage) :is(th, td) { overflow-wrap: normal; word-break: normal; }
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
    return (f"This is <strong>radixchat</strong>, serving {served}.<br>"
            "Sign in with your radixchat user. No user yet? Whoever runs the server adds one "
            "with <code>radixchat users add NAME</code>.")


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
    """Per browser session: the conversation the chat area shows."""
    conv: int | None = None


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


def build_page(engine: Engine, settings: Settings, store: Store, metrics: Metrics | None = None, *,
               sign_in: bool = True) -> gr.Blocks:
    model = engine.loaded
    chat = ChatPage(engine, store, metrics, model_id=model.model_id, default_max_tokens=settings.max_tokens,
                    signed_in=sign_in)
    presence = Presence()
    presets = load_presets()

    def who(request: gr.Request):
        name = getattr(request, "username", None) if sign_in else None
        try:
            user = chat.user(name)
        except Exception as e:
            raise PageError(f"Signed-in user {name!r} is unknown now; sign in again ({e}).")
        presence.seen(user.name)
        return user

    def preset_of(text: str) -> str:
        if not text:
            return NO_PROMPT
        return next((name for name, body in presets.items() if body == text), CUSTOM)

    def strip(user, current: int | None, open_tabs: list[Conversation] | None = None):
        open_tabs = chat.tabs(user) if open_tabs is None else open_tabs
        return gr.Radio(choices=[(c.title, c.id) for c in open_tabs], value=current)

    def action(writing: bool):
        """The one Send/Stop button, as it reads for a tab: Stop while a reply is written there."""
        return gr.Button(STOP if writing else SEND, variant="stop" if writing else "primary")

    def shown(user, conv_id: int, view: View):
        """Everything that changes when a tab comes into view: strip, chat, title, prompt, button."""
        view.conv = conv_id
        conv = chat.conversation(user, conv_id)
        return (strip(user, conv_id), chat.messages(user, conv_id), conv.title,
                conv.system_prompt, preset_of(conv.system_prompt), action(chat.writing(user, conv_id)))

    def closed_list(user, search: str):
        """The History panel: closed tabs, or what a search found (labels are shown as text)."""
        return gr.Radio(choices=chat.find(user, search), value=None,
                        label="Found" if (search or "").strip() else "Closed tabs")

    # which model answers, as its card says (core.engine.catalog)
    card = model.card
    recommended = dict(card.sampling) if card else {}
    facts = model_facts(model)
    model_line = f"`{model.model_id}`" + (f" ({facts})" if facts else "")
    note_line = (f"  \n*{card.note}*" if card and card.note else "") + (
        f" Its card: `{card.link}` in radixchat's repository." if card and card.link else "")
    temperature_label = "Temperature" + (
        f" (model card: {recommended['temperature']:g}"
        + (f"; top-p {recommended['top_p']:g}" if "top_p" in recommended else "") + ")"
        if "temperature" in recommended else "")

    with gr.Blocks(title="radixchat", analytics_enabled=False) as page:
        view = gr.State(View())
        with gr.Row(elem_id="top-row", equal_height=True):
            header = gr.Markdown(elem_id="header")
            # a plain link in this tab: /logout ends the session on the server and lands on the
            # sign-in page (a Markdown link would open a new tab and leave this one signed in)
            gr.Button("Sign out", link="logout", link_target="_self", size="sm", scale=0, min_width=90,
                      elem_id="sign-out", visible=sign_in)
        with gr.Tabs():
            with gr.Tab("Chat", id="chat") as chat_section:
                with gr.Row(elem_id="tab-row", equal_height=True):
                    tabs = gr.Radio(show_label=False, container=False, elem_id="conv-tabs", scale=20)
                    new = gr.Button("+", elem_id="new-tab", scale=0, min_width=44, size="sm")
                with gr.Row():
                    with gr.Column(scale=4):
                        # messages arrive as Markdown whose HTML is text (logic.row, markup.py); the
                        # sanitizer stays on behind that, custom tags are not let through, and LaTeX
                        # is off: its renderer pastes text into the page as HTML
                        chatbot = gr.Chatbot(show_label=False, elem_id="chat", height=540, buttons=["copy"],
                                             feedback_options=None, sanitize_html=True, render_markdown=True,
                                             allow_tags=False, latex_delimiters=[],
                                             placeholder="Replies stream here, with time to first token, "
                                                         "tokens/s and cached prompt tokens under each.")
                        # one row that never wraps, so Send/Stop stays beside the box on a phone
                        with gr.Row(elem_id="compose"):
                            message = gr.Textbox(placeholder="Message (Enter sends, Shift+Enter: new line)",
                                                 show_label=False, lines=1, max_lines=10, scale=8,
                                                 elem_id="message", autofocus=True, min_width=0)
                            send = gr.Button(SEND, variant="primary", scale=0, min_width=72, elem_id="send")
                        with gr.Row():
                            regenerate = gr.Button("Regenerate", size="sm", elem_id="regenerate")
                    with gr.Column(scale=1, min_width=260):
                        with gr.Accordion("This tab", open=True):
                            title = gr.Textbox(label="Title", max_lines=1, elem_id="title")
                            with gr.Row():
                                rename = gr.Button("Rename", size="sm", elem_id="rename")
                                close = gr.Button("Close tab", size="sm", elem_id="close-tab")
                            with gr.Row():
                                export_md = gr.Button("Export Markdown", size="sm", elem_id="export-md")
                                export_json = gr.Button("Export JSON", size="sm", elem_id="export-json")
                            exported = gr.Textbox(visible=False, elem_id="exported")
                            with gr.Row():
                                share = gr.Button("Share", size="sm", elem_id="share")
                                unshare = gr.Button("Stop sharing", size="sm", elem_id="unshare")
                            # the read-only link (webui/page/shared.py), for signed-in users here
                            share_link = gr.Textbox(label="Read-only link for users of this server",
                                                    interactive=False, max_lines=1, elem_id="share-link",
                                                    placeholder="Not shared", buttons=["copy"])
                        with gr.Accordion("Settings", open=True):
                            preset = gr.Dropdown([NO_PROMPT, *presets, CUSTOM], value=NO_PROMPT,
                                                 label="System prompt", elem_id="preset")
                            system = gr.Textbox(label="System prompt of this tab", lines=3, max_lines=12,
                                                elem_id="system")
                            temperature = gr.Slider(0, 2, value=recommended.get("temperature", 0.0), step=0.05,
                                                    label=temperature_label, elem_id="temperature")
                            max_tokens = gr.Slider(1, model.context_length, value=settings.max_tokens, step=1,
                                                   label="Max tokens", elem_id="max-tokens")
                        with gr.Accordion("History", open=False):
                            search = gr.Textbox(label="Search all your chats (titles and messages)",
                                                max_lines=1, elem_id="search")
                            archived = gr.Radio(label="Closed tabs", elem_id="archived")
                            reopen = gr.Button("Open", size="sm", elem_id="reopen")
            with gr.Tab("Server", id="server") as server_section:
                summary = gr.Markdown(elem_id="server-summary")
                usage = gr.Markdown(elem_id="your-usage")
                with gr.Row():
                    requests_plot = gr.BarPlot(x="time", y="count", color="series", y_title="requests",
                                               label="Requests per minute (last hour)", elem_id="requests-plot")
                    ttft_plot = gr.ScatterPlot(x="time", y="ms", color="series", y_title="ms",
                                               label="Time to first token per minute (last hour)",
                                               elem_id="ttft-plot")
                timer = gr.Timer(REFRESH_S, active=False)

        tab_view = [tabs, chatbot, title, system, preset, send]

        @_notices(8)
        def on_load(view: View, request: gr.Request):
            user = who(request)
            who_line = (f"signed in as **{user.name}**" if sign_in
                        else "no sign-in: everyone here is the same local user")
            head = f"**radixchat** · {model_line} · {who_line}{note_line}"
            _, current = chat.start(user)
            return (head, *shown(user, current, view), closed_list(user, ""))

        @_notices(6)
        def switch(conv_id, view: View, request: gr.Request):
            return shown(who(request), conv_id, view)

        @_notices(6)
        def new_tab(system_text, view: View, request: gr.Request):
            user = who(request)
            return shown(user, chat.new_tab(user, system_text).id, view)

        @_notices(2)
        def rename_tab(conv_id, new_title, request: gr.Request):
            user = who(request)
            conv = chat.rename(user, conv_id, new_title)
            return strip(user, conv_id), conv.title

        @_notices(7)
        def close_tab(conv_id, query, view: View, request: gr.Request):
            user = who(request)
            return (*shown(user, chat.close(user, conv_id), view), closed_list(user, query))

        @_notices(1)
        def find_closed(query, request: gr.Request):
            return closed_list(who(request), query)

        @_notices(7)
        def reopen_tab(conv_id, query, view: View, request: gr.Request):
            user = who(request)
            if conv_id is None:
                raise PageError("Pick a chat in the list first.")
            conv = chat.open(user, conv_id)
            return (*shown(user, conv.id, view), closed_list(user, query))

        @_notices(1)
        def apply_preset(name, conv_id, request: gr.Request):
            text = presets.get(name, "") if name != CUSTOM else gr.skip()
            if name != CUSTOM:
                chat.set_system_prompt(who(request), conv_id, text)
            return text

        @_notices(1)
        def save_system(text, conv_id, request: gr.Request):
            chat.set_system_prompt(who(request), conv_id, text)
            return preset_of(text)

        async def respond(text, conv_id, temp, n_tokens, view: View, request: gr.Request, again=False):
            """Stream a reply into the chat area while its tab is in view (outputs: chat, message box,
            strip, title, Send/Stop). A refusal leaves the typed text in the box and shows a notice."""
            skip = gr.skip()
            try:
                user = await asyncio.to_thread(who, request)
                if conv_id is None:
                    conv_id = (await asyncio.to_thread(chat.new_tab, user)).id
                view.conv = conv_id
                first, visible, reads_stop = True, True, None

                def button():
                    """The button for the tab in view, when that changed: this reply began or ended,
                    or another tab (writing or not) came into view meanwhile."""
                    nonlocal reads_stop
                    writing = chat.writing(user, view.conv)
                    if writing == reads_stop:
                        return skip
                    reads_stop = writing
                    return action(writing)

                async for msgs in chat.reply(user, conv_id, text, temperature=temp, max_tokens=n_tokens,
                                             regenerate=again):
                    here = view.conv == conv_id
                    if first:  # the strip and title, for the title a first message gives its tab
                        open_tabs = await asyncio.to_thread(chat.tabs, user)
                        title_now = next((c.title for c in open_tabs if c.id == conv_id), skip)
                        yield (msgs if here else skip, skip if again else "", strip(user, view.conv, open_tabs),
                               title_now if here else skip, button())
                        visible, first = here, False
                    elif here:
                        visible = True
                        yield msgs, skip, skip, skip, button()
                    elif visible:  # its tab was left: make sure the chat area shows the one in view
                        visible = False
                        try:
                            other = await asyncio.to_thread(chat.messages, user, view.conv)
                        except PageError:
                            other = skip
                        yield other, skip, skip, skip, button()
                if not first:  # ended: the tab in view reads Send again, unless it writes too
                    yield skip, skip, skip, skip, button()
            except PageError as e:
                notice(e)
                yield skip, skip, skip, skip, skip  # refused before it began, or after its last yield

        async def respond_again(conv_id, temp, n_tokens, view: View, request: gr.Request):
            async for out in respond(None, conv_id, temp, n_tokens, view, request, again=True):
                yield out

        async def send_pressed(label, text, conv_id, temp, n_tokens, view: View, request: gr.Request):
            """The button read Send when pressed: send (Stop is `stop_pressed`, outside the queue)."""
            if label == STOP:
                yield gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
                return
            async for out in respond(text, conv_id, temp, n_tokens, view, request):
                yield out

        @_notices(1)
        def stop_pressed(label, conv_id, request: gr.Request):
            """The button read Stop when pressed: cancel the tab's reply in the engine (what it wrote
            stays; its own event turns the button back to Send). Not queued behind the replies."""
            if label != STOP:
                return gr.skip()
            if conv_id is None or not chat.stop(who(request), conv_id):
                return action(False)  # it ended meanwhile
            return gr.skip()

        def export(fmt: str):
            def export_tab(conv_id, request: gr.Request):
                """The tab as the store exports it, for the browser to save (SAVE)."""
                try:
                    name, text = chat.export(who(request), conv_id, fmt)
                except PageError as e:
                    notice(e)
                    return ""  # nothing to save, whatever an earlier export left here
                return json.dumps({"name": name, "type": MEDIA_TYPES[fmt], "text": text})
            export_tab.__name__ = f"export_{fmt}"
            return export_tab

        def link_of(token: str | None, request: gr.Request) -> str:
            """The link on the request's own host: what the owner's browser reached is what
            another browser on the LAN can reach too."""
            if not token:
                return ""
            host = request.headers.get("host") or "localhost"
            return shared_link(f"http://{host}", token)

        @_notices(1)
        def share_tab(conv_id, request: gr.Request):
            return link_of(chat.share(who(request), conv_id), request)

        @_notices(1)
        def unshare_tab(conv_id, request: gr.Request):
            chat.unshare(who(request), conv_id)
            gr.Info("Stopped sharing: the link now shows \"not found\".")
            return ""

        @_notices(1)
        def share_shown(conv_id, request: gr.Request):
            return link_of(chat.share_token(who(request), conv_id), request)

        @_notices(4)
        def refresh(request: gr.Request):
            you = who(request)  # an open Server tab counts as being signed in
            d = dashboard(engine, store, presence, you=you)
            # both plots span the whole window their titles name, points or not
            return (d.summary, d.usage, gr.BarPlot(d.requests, x_lim=list(d.x_lim)),
                    gr.ScatterPlot(d.ttft, x_lim=list(d.x_lim)))

        private = {"api_visibility": "private"}
        generating = {"concurrency_id": "generate", "show_progress": "hidden", "trigger_mode": "multiple",
                      "concurrency_limit": max(settings.max_batch, settings.max_queue), **private}
        page.load(on_load, [view], [header, *tab_view, archived], **private)
        tabs.input(switch, [tabs, view], tab_view, **private)
        new.click(new_tab, [system, view], tab_view, **private)
        gr.on([rename.click, title.submit], rename_tab, [tabs, title], [tabs, title], **private)
        close.click(close_tab, [tabs, search, view], [*tab_view, archived], **private)
        search.change(find_closed, [search], [archived], **private)
        reopen.click(reopen_tab, [archived, search, view], [*tab_view, archived], **private)
        preset.input(apply_preset, [preset, tabs], [system], **private)
        system.blur(save_system, [system, tabs], [preset], **private)
        replying = [chatbot, message, tabs, title, send]
        message.submit(respond, [message, tabs, temperature, max_tokens, view], replying, **generating)
        # one click, two events: each acts only if the button read its word when pressed
        send.click(send_pressed, [send, message, tabs, temperature, max_tokens, view], replying, **generating)
        send.click(stop_pressed, [send, tabs], [send], concurrency_limit=None, show_progress="hidden",
                   **private)
        regenerate.click(respond_again, [tabs, temperature, max_tokens, view], replying, **generating)
        for button, fmt in ((export_md, "md"), (export_json, "json")):
            button.click(export(fmt), [tabs], [exported], **private).then(None, [exported], None, js=SAVE,
                                                                          **private)
        share.click(share_tab, [tabs], [share_link], **private)
        unshare.click(unshare_tab, [tabs], [share_link], **private)
        tabs.change(share_shown, [tabs], [share_link], show_progress="hidden", **private)
        server_view = [summary, usage, requests_plot, ttft_plot]
        server_section.select(lambda: gr.Timer(active=True), None, timer, **private).then(
            refresh, None, server_view, **private)
        chat_section.select(lambda: gr.Timer(active=False), None, timer, **private)
        timer.tick(refresh, None, server_view, show_progress="hidden", **private)
    page.queue(default_concurrency_limit=settings.max_batch)
    return page
