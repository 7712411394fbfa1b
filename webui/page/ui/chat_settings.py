"""The panel beside the chat area: "This chat" (its title, Rename, Delete, the exports, Share
and its link) and "Settings" (the model the chat chats with, the system prompt, from a preset
or typed, the temperature and the reply's length).

Components only: what they do is webui/page/events/handlers.py's, their events webui/page/events/wiring.py's.
The model picker lists the served models and is shown only when there are several; the line
under it says what the picked one is (webui/page/logic/model_card.py's `pick_note`). The temperature
starts at the first model's card's recommendation, or 0 (greedy) for a model without one
(webui/page/logic/model_card.py). Built once, when the page is built; no MLX.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import gradio as gr

from radixchat.webui.page.events.view import CUSTOM, NO_PROMPT
from radixchat.webui.page.logic.model_card import pick_note, recommended, temperature_label

if TYPE_CHECKING:
    from radixchat.core.seam.protocol import ModelInfo


# the prefix cache shares a system prompt whole between users (docs/SECURITY.md)
SYSTEM_PROMPT_HELP = (
    "Cached for anyone who sends exactly the same one: cached tokens and speed can confirm "
    "a guess of a whole system prompt, never of a part."
)


@dataclass
class ThisChat:
    title: gr.Textbox
    rename: gr.Button
    delete: gr.Button
    export_md: gr.Button
    export_json: gr.Button
    exported: gr.Textbox  # an export on its way to the browser, which saves it
    share: gr.Button
    unshare: gr.Button
    share_link: gr.Textbox


@dataclass
class ChatSettings:
    model: gr.Dropdown  # the chat in view's model
    model_note: gr.Markdown  # what the picked model is, and whether it is loaded
    preset: gr.Dropdown
    system: gr.Textbox
    temperature: gr.Slider
    max_tokens: gr.Slider


def chat_settings(
    presets: dict[str, str], model: ModelInfo, max_tokens: int, models: list[str]
) -> tuple[ThisChat, ChatSettings]:
    """The panel; `model` is the first model's, `models` the served ids, the first first."""
    with gr.Column(scale=1, min_width=260):
        with gr.Accordion("This chat", open=True):
            this = this_chat()
        with gr.Accordion("Settings", open=True):
            settings = settings_panel(presets, model, max_tokens, models)
    return this, settings


def this_chat() -> ThisChat:
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
    # the read-only link (webui/page/routes/shared.py), for signed-in users here
    share_link = gr.Textbox(
        label="Read-only link for users of this server",
        interactive=False,
        max_lines=1,
        elem_id="share-link",
        placeholder="Not shared",
        buttons=["copy"],
    )
    return ThisChat(title, rename, delete, export_md, export_json, exported, share, unshare, share_link)


def settings_panel(presets: dict[str, str], model: ModelInfo, max_tokens: int, models: list[str]) -> ChatSettings:
    several = len(models) > 1
    picker = gr.Dropdown(models, value=models[0], label="Model", elem_id="model", visible=several)
    note = gr.Markdown(pick_note(model), elem_id="model-note", visible=several)
    preset = gr.Dropdown([NO_PROMPT, *presets, CUSTOM], value=NO_PROMPT, label="System prompt", elem_id="preset")
    system = gr.Textbox(
        label="System prompt of this chat",
        info=SYSTEM_PROMPT_HELP,
        lines=3,
        max_lines=12,
        elem_id="system",
    )
    temperature = gr.Slider(
        0,
        2,
        value=recommended(model).get("temperature", 0.0),
        step=0.05,
        label=temperature_label(model),
        elem_id="temperature",
    )
    tokens = gr.Slider(1, model.context_length, value=max_tokens, step=1, label="Max tokens", elem_id="max-tokens")
    return ChatSettings(picker, note, preset, system, temperature, tokens)
