"""The chat area and what is under it: the messages, the bar of an edit under way, the message
box with its one Send/Stop button, Regenerate and Continue, and the hidden pair the controls inside a
message press.

Components only: what they do is webui/page/events/handlers.py's and webui/page/events/sending.py's, their
events webui/page/events/wiring.py's; the panel beside it is webui/page/ui/chat_settings.py. Built
once, when the page is built; no MLX.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from radixchat.webui.page.events.view import SEND


@dataclass
class ChatArea:
    chatbot: gr.Chatbot
    edit_bar: gr.Row  # shown while a sent message is being edited
    cancel_edit: gr.Button
    message: gr.Textbox
    send: gr.Button  # reads Stop while a reply is written in the chat in view
    regenerate: gr.Button
    go_on: gr.Button  # Continue: the last answer, then more (after a length limit or Stop)
    versions_go: gr.Button  # pressed by the browser for ‹ › or Edit in a message
    asked: gr.Textbox  # what was clicked there


def chat_area() -> ChatArea:
    with gr.Column(scale=4):
        # messages arrive as Markdown whose HTML is text (rows.row, markup.py); the
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
            placeholder="Replies stream here, with time to first token, tokens/s and cached prompt tokens under each.",
        )
        # after "Edit" under a message: its text is in the box, Send makes a new version
        with gr.Row(visible=False, elem_id="edit-bar") as edit_bar:
            gr.Markdown(
                # short: on a phone it sits between the chat and the box
                "Editing: **Send** makes a new version (the old stays, ‹ 1/2 ›).",
                elem_id="edit-note",
            )
            cancel_edit = gr.Button("Cancel", size="sm", scale=0, min_width=80, elem_id="cancel-edit")
        # one row that never wraps, so Send/Stop stays beside the box on a phone
        with gr.Row(elem_id="compose"):
            message = gr.Textbox(
                label="Message",  # (hidden, but what a screen reader names it: else "Textbox")
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
        with gr.Row(elem_id="again-row"):
            regenerate = gr.Button("Regenerate", size="sm", elem_id="regenerate", min_width=0)
            go_on = gr.Button("Continue", size="sm", elem_id="continue", min_width=0)
        # pressed by the browser (versions.LISTEN) for a click on ‹ › or Edit in a message
        versions_go = gr.Button(visible="hidden", elem_id="versions-go")
        asked = gr.Textbox(visible=False, elem_id="versions-asked")
    return ChatArea(chatbot, edit_bar, cancel_edit, message, send, regenerate, go_on, versions_go, asked)
