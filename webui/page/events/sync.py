"""A tab catching up with what its user did elsewhere: chats made, renamed or deleted in
another tab or on another device, and a reply that began in the chat in view.

The browser asks every few seconds while the tab is visible (webui/page/ui/shortcuts.py's
`SYNC`); `synced` answers with the sidebar's list only when it differs from the last one this
tab was sent, and only its choices: the chat picked stays the browser's, so a pick made while
an answer was on its way is never undone, and the message box is not touched. The chat in
view's title box follows a rename made elsewhere, unless it is being edited here: it is
replaced only while it still holds the title this tab last showed (`View.title`). When a reply of
the user's is being written in the chat in view and this tab watches none, it bumps the
hidden `follow_go`, whose change starts following it (webui/page/events/sending.py's
`follow_reply`, wired by webui/page/events/wiring.py). A part of the page's handlers
(webui/page/events/handlers.py). Runs in Gradio's worker threads. No MLX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import gradio as gr

from radixchat.webui.page.events.view import PageView, Skip, View, skip_output
from radixchat.webui.page.logic.errors import PageError

if TYPE_CHECKING:
    from radixchat.core.store import User


class Syncing(PageView):
    """The handler of a tab's periodic question."""

    def synced(
        self,
        query: str | None,
        conv_id: int | None,
        follows: int | None,
        title: str | None,
        view: View,
        request: gr.Request,
    ) -> tuple[gr.Radio | Skip, int | Skip, str | Skip]:
        """(the sidebar's choices, or skip; `follow_go` bumped, or skip; the title box, or skip)."""
        skip = gr.skip()
        try:
            user = self.who(request)
            found = self.chat.find(user, query or "")
        except PageError:  # signed out elsewhere (the tab's next action says so), or a search refused
            return skip, skip, skip
        choices: gr.Radio | Skip = skip
        if found != view.listed:
            view.listed = found
            choices = gr.Radio(choices=found)
        conv_id = None if conv_id is None else int(conv_id)
        here = conv_id is not None and conv_id == view.conv
        titled = self._title(user, conv_id, title, view) if here and conv_id is not None else skip
        run = self.chat.live(user, conv_id) if here else None
        if run is None or not run.live or view.watching == (conv_id, run.started):
            return choices, skip, titled
        return choices, int(follows or 0) + 1, titled

    def _title(self, user: User, conv_id: int, box: str | None, view: View) -> str | Skip:
        """The chat in view's title, renamed elsewhere, for its box; skip when it was not, or
        when the box no longer holds what this tab showed (someone is editing it here)."""
        try:
            stored = self.chat.conversation(user, conv_id).title
        except PageError:  # deleted elsewhere: the sidebar's list says so
            return skip_output()
        if view.title is None or stored == view.title or (box or "") != view.title:
            return skip_output()
        view.title = stored
        return stored
