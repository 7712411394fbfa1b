"""The sidebar: "New chat", a search over one's chats (saying when nothing matched), "Undo
delete", the list of chats (saying where they will be while there are none), and on a phone the header's words in full (the header itself is
one line there, webui/page/ui/style.py).

Gradio's `Sidebar`: beside the chat on a wide screen, a drawer over it at 768 px and less,
closed there until its button opens it (webui/page/ui/scripts.py). Components only: what they do
is webui/page/events/handlers.py's, their events webui/page/events/wiring.py's. Built once, when the page is
built; no MLX.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

UNDO_S = 10.0  # how long "Undo delete" is offered (the store keeps a deleted chat longer)


@dataclass
class Sidebar:
    new: gr.Button
    search: gr.Textbox
    undo: gr.Button  # shown for UNDO_S after a delete
    conv_list: gr.Radio  # one's chats newest first, or what the search found
    undo_timer: gr.Timer  # hides "Undo delete" again
    about: gr.Markdown  # the header's words in full, shown on a phone only (its header is cut short)
    sync_go: gr.Button  # pressed by the browser while the tab is visible (shortcuts.SYNC)
    follow_go: gr.Number  # bumped by a sync that found a reply begun in the chat in view


def sidebar() -> Sidebar:
    # closed at first: OPEN_WIDE opens it beside the chat on a wide screen, a phone keeps the page
    with gr.Sidebar(open=False, width=280, elem_id="sidebar"):
        new = gr.Button("New chat", variant="primary", size="sm", elem_id="new-chat")
        search = gr.Textbox(  # labels hidden, but what a screen reader names them (else "Textbox", "Radio")
            label="Search your chats",
            placeholder="Search your chats",
            show_label=False,
            container=False,
            max_lines=1,
            elem_id="search",
        )
        # shown by the page's CSS (webui/page/ui/style.py) while a search is typed and lists nothing
        gr.Markdown("No chat matches this search.", elem_id="search-none")
        # and while nothing is typed and the list is empty: a first visit, before a first message
        gr.Markdown("Your chats will be listed here once you send a first message.", elem_id="chats-none")
        undo = gr.Button("Undo delete", size="sm", visible=False, elem_id="undo")
        conv_list = gr.Radio(label="Your chats", show_label=False, container=False, elem_id="conv-list")
        undo_timer = gr.Timer(UNDO_S, active=False)
        about = gr.Markdown(elem_id="side-about")
        # rendered but not shown: the browser presses the one, and the other's change is an event
        sync_go = gr.Button(visible="hidden", elem_id="sync-go")
        follow_go = gr.Number(0, precision=0, visible="hidden", elem_id="follow-go")
    return Sidebar(new, search, undo, conv_list, undo_timer, about, sync_go, follow_go)
