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
its tab is the one in view (`View`, per browser session). No MLX here.
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
#top-row { align-items: center; }
#chat button[aria-label="Clear"] { display: none; }
.rc-stats { font-size: 0.8em; opacity: 0.7; }
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

    def shown(user, conv_id: int, view: View):
        """Everything that changes when a tab comes into view: strip, chat, title, prompt."""
        view.conv = conv_id
        conv = chat.conversation(user, conv_id)
        return (strip(user, conv_id), chat.messages(user, conv_id), conv.title,
                conv.system_prompt, preset_of(conv.system_prompt))

    def closed_list(user, search: str):
        return gr.Radio(choices=[(f"{c.title}", c.id) for c in chat.archived(user, search)], value=None)

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
                        with gr.Row():
                            message = gr.Textbox(placeholder="Message (Enter sends, Shift+Enter: new line)",
                                                 show_label=False, lines=1, max_lines=10, scale=8,
                                                 elem_id="message", autofocus=True)
                            send = gr.Button("Send", variant="primary", scale=1, elem_id="send")
                        with gr.Row():
                            stop = gr.Button("Stop", variant="stop", size="sm", elem_id="stop")
                            regenerate = gr.Button("Regenerate", size="sm", elem_id="regenerate")
                    with gr.Column(scale=1, min_width=260):
                        with gr.Accordion("This tab", open=True):
                            title = gr.Textbox(label="Title", max_lines=1, elem_id="title")
                            with gr.Row():
                                rename = gr.Button("Rename", size="sm", elem_id="rename")
                                close = gr.Button("Close tab", size="sm", elem_id="close-tab")
                        with gr.Accordion("Settings", open=True):
                            preset = gr.Dropdown([NO_PROMPT, *presets, CUSTOM], value=NO_PROMPT,
                                                 label="System prompt", elem_id="preset")
                            system = gr.Textbox(label="System prompt of this tab", lines=3, max_lines=12,
                                                elem_id="system")
                            temperature = gr.Slider(0, 2, value=recommended.get("temperature", 0.7), step=0.05,
                                                    label=temperature_label, elem_id="temperature")
                            max_tokens = gr.Slider(1, model.context_length, value=settings.max_tokens, step=1,
                                                   label="Max tokens", elem_id="max-tokens")
                        with gr.Accordion("History", open=False):
                            search = gr.Textbox(label="Search closed tabs by title", max_lines=1,
                                                elem_id="search")
                            archived = gr.Radio(label="Closed tabs", elem_id="archived")
                            reopen = gr.Button("Reopen", size="sm", elem_id="reopen")
            with gr.Tab("Server", id="server") as server_section:
                summary = gr.Markdown(elem_id="server-summary")
                with gr.Row():
                    requests_plot = gr.BarPlot(x="time", y="count", color="series", y_title="requests",
                                               label="Requests per minute (last hour)", elem_id="requests-plot")
                    ttft_plot = gr.ScatterPlot(x="time", y="ms", color="series", y_title="ms",
                                               label="Time to first token per minute (last hour)",
                                               elem_id="ttft-plot")
                timer = gr.Timer(REFRESH_S, active=False)

        tab_view = [tabs, chatbot, title, system, preset]

        @_notices(7)
        def on_load(view: View, request: gr.Request):
            user = who(request)
            who_line = (f"signed in as **{user.name}**" if sign_in
                        else "no sign-in: everyone here is the same local user")
            head = f"**radixchat** · {model_line} · {who_line}{note_line}"
            _, current = chat.start(user)
            return (head, *shown(user, current, view), closed_list(user, ""))

        @_notices(5)
        def switch(conv_id, view: View, request: gr.Request):
            return shown(who(request), conv_id, view)

        @_notices(5)
        def new_tab(system_text, view: View, request: gr.Request):
            user = who(request)
            return shown(user, chat.new_tab(user, system_text).id, view)

        @_notices(2)
        def rename_tab(conv_id, new_title, request: gr.Request):
            user = who(request)
            conv = chat.rename(user, conv_id, new_title)
            return strip(user, conv_id), conv.title

        @_notices(6)
        def close_tab(conv_id, query, view: View, request: gr.Request):
            user = who(request)
            return (*shown(user, chat.close(user, conv_id), view), closed_list(user, query))

        @_notices(1)
        def find_closed(query, request: gr.Request):
            return closed_list(who(request), query)

        @_notices(6)
        def reopen_tab(conv_id, query, view: View, request: gr.Request):
            user = who(request)
            if conv_id is None:
                raise PageError("Pick a closed tab in the list first.")
            conv = chat.reopen(user, conv_id)
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
            strip, title). A refusal leaves the typed text in the box and shows a notice."""
            skip = gr.skip()
            try:
                user = await asyncio.to_thread(who, request)
                if conv_id is None:
                    conv_id = (await asyncio.to_thread(chat.new_tab, user)).id
                view.conv = conv_id
                first, visible = True, True
                async for msgs in chat.reply(user, conv_id, text, temperature=temp, max_tokens=n_tokens,
                                             regenerate=again):
                    here = view.conv == conv_id
                    if first:  # the strip and title, for the title a first message gives its tab
                        open_tabs = await asyncio.to_thread(chat.tabs, user)
                        title_now = next((c.title for c in open_tabs if c.id == conv_id), skip)
                        yield (msgs if here else skip, skip if again else "", strip(user, view.conv, open_tabs),
                               title_now if here else skip)
                        visible, first = here, False
                    elif here:
                        visible = True
                        yield msgs, skip, skip, skip
                    elif visible:  # its tab was left: make sure the chat area shows the one in view
                        visible = False
                        try:
                            other = await asyncio.to_thread(chat.messages, user, view.conv)
                        except PageError:
                            other = skip
                        yield other, skip, skip, skip
            except PageError as e:
                notice(e)
                yield skip, skip, skip, skip

        async def respond_again(conv_id, temp, n_tokens, view: View, request: gr.Request):
            async for out in respond(None, conv_id, temp, n_tokens, view, request, again=True):
                yield out

        def stop_reply(conv_id, request: gr.Request):
            if conv_id is not None and not chat.stop(who(request), conv_id):
                gr.Info("Nothing is being written in this tab.")

        @_notices(3)
        def refresh(request: gr.Request):
            who(request)  # an open Server tab counts as being signed in
            d = dashboard(engine, store, presence)
            return d.summary, d.requests, d.ttft

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
        gr.on([message.submit, send.click], respond, [message, tabs, temperature, max_tokens, view],
              [chatbot, message, tabs, title], **generating)
        regenerate.click(respond_again, [tabs, temperature, max_tokens, view], [chatbot, message, tabs, title],
                         **generating)
        stop.click(stop_reply, [tabs], None, concurrency_limit=None, **private)
        server_section.select(lambda: gr.Timer(active=True), None, timer, **private).then(
            refresh, None, [summary, requests_plot, ttft_plot], **private)
        chat_section.select(lambda: gr.Timer(active=False), None, timer, **private)
        timer.tick(refresh, None, [summary, requests_plot, ttft_plot], show_progress="hidden", **private)
    page.queue(default_concurrency_limit=settings.max_batch)
    return page
