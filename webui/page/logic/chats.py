"""The chats of the page, without the replies: who is asking, the sidebar's list, opening,
naming, deleting and sharing a chat, its branch in view, and its export.

A part of `ChatPage` (webui/page/logic/chat_page.py), over the replies (webui/page/logic/replies.py, which
writes them) and the state every part shares (webui/page/logic/state.py). The sidebar lists
all of the user's conversations, newest first (the store's "archived" means nothing here: an
archived one is listed like any other), or, with a search, those whose title or messages hold
its words (the store's full-text index). "New chat" makes nothing: the first message of a new
chat starts one, in the user's empty untitled conversation if there is one, so empty chats
never pile up and a new chat never inherits another's system prompt or model. Delete hides a
conversation at once and can be undone for a while (the store's `mark_deleted`), and the
engine forgets what it cached of it (`forget_conversation`). The
conversation opened last, in any browser, is noted in the store and opens on the next load.
A conversation is a tree of messages in the store, one branch of it in view: the older
versions of a message stay and can be shown again (`show_version`, the "‹ i/n ›" under a
message, webui/page/logic/versions.py), what follows them with them; the branch shown is the branch
the model sees next. Export hands out the store's own Markdown and JSON exports of a chat.

Synchronous: runs where the page calls it (Gradio's worker threads). No MLX, no Gradio.
"""

from __future__ import annotations

import logging
import re
import secrets
from typing import Any

from radixchat.core.seam.requests import RequestError
from radixchat.core.store import AlreadyExists, Conversation, NotFound, StoreError, User
from radixchat.webui.page.logic.errors import PageError, check_text, guard, refusal
from radixchat.webui.page.logic.replies import TITLE_CHARS, Replies
from radixchat.webui.page.logic.rows import chat_rows, visible_turns

log = logging.getLogger("radixchat.page")

LOCAL_USER = "local"  # who everyone is with --no-auth
SEARCH_HITS = 50  # the most conversations a search lists
LISTED = 200  # the most conversations the sidebar lists


class Chats(Replies):
    """ChatPage's chats: every method takes the signed-in user, whose chats alone it reaches."""

    # ---- who ----

    def user(self, name: str | None) -> User:
        """The signed-in user; with no sign-in (--no-auth), the shared local user, made on first use."""
        if name:
            return self.store.get_user(name)
        try:
            return self.store.get_user(LOCAL_USER)
        except NotFound:
            try:
                # nobody signs in as it: no admin, and the first real account made later is one
                return self.store.create_user(LOCAL_USER, secrets.token_urlsafe(24), account=False)
            except AlreadyExists:  # another request made it first
                return self.store.get_user(LOCAL_USER)

    def browser_key(self, user: User) -> str:
        """What the user's page keeps in a browser is kept under (the store's, never reused)."""
        return guard(self.store.browser_key, user.name) or ""

    # ---- the sidebar ----

    def conversations(self, user: User) -> list[Conversation]:
        """The sidebar's list: every conversation of the user's with a message, newest activity
        first (an empty one, left by a refused first message, is the next new chat's)."""
        return guard(self.store.list_conversations, user, archived=None, limit=LISTED, with_messages=True)

    def find(self, user: User, query: str = "") -> list[tuple[str, int]]:
        """The sidebar's list as (label, conversation id): with no query, every conversation,
        newest first, by title; with one, those whose title or messages hold its words (the
        store's full-text search), best first, each labelled with its title and the piece of
        text that matched. Labels are plain text, shown as text."""
        if not (query or "").strip():
            return [(c.title, c.id) for c in self.conversations(user)]
        check_text(query, "search")
        hits = guard(self.store.search_conversations, user, query, limit=SEARCH_HITS)
        return [
            (
                h.conversation.title
                if h.snippet in ("", h.conversation.title)
                else f"{h.conversation.title} — {h.snippet}",
                h.conversation.id,
            )
            for h in hits
        ]

    def start(self, user: User) -> int | None:
        """The conversation a page opens on load: the one the user had open last (in this
        browser or another), else the newest; None (a new chat) for someone who has none."""
        conv = guard(self.store.open_conversation, user)
        if conv is None:
            newest = guard(self.store.list_conversations, user, archived=None, limit=1)
            conv = newest[0] if newest else None
        return None if conv is None else conv.id

    def show(self, user: User, conv_id: int) -> Conversation:
        """Open a conversation: it is the user's open one from now on (reload, other browsers)."""
        guard(self.store.set_open_conversation, user, conv_id)
        return self.conversation(user, conv_id)

    def new_chat(
        self, user: User, system_prompt: str = "", *, reuse: bool = True, model: str | None = None
    ) -> Conversation:
        """A conversation to start a new chat in: the user's empty untitled one if there is one
        (no reply is being written there), else a new one; with `system_prompt` and `model`
        (None, or one not served: the first), nothing else of any other chat. `reuse=False`
        always makes a new one: for a caller that sends in it later, when another session of
        the same user may have been handed the same empty one."""
        check_text(system_prompt, "system prompt")
        model = self.served_name(model)
        if not reuse:
            return guard(self.store.create_conversation, user, None, system_prompt or "", model=model)
        with self._claiming:
            return guard(self.store.fresh_conversation, user, system_prompt or "", set(self.running), model=model)

    def rename(self, user: User, conv_id: int | None, title: str) -> Conversation:
        if conv_id is None:
            raise PageError("Send a first message: a new chat is named after it, and can be renamed then.")
        if not (title or "").strip():
            raise PageError("A chat's title can't be empty.")
        check_text(title, "title")
        return guard(self.store.rename_conversation, user, conv_id, title)

    def delete(self, user: User, conv_id: int | None) -> Conversation:
        """Delete a conversation, undoably for a while (`undo_delete`); stops its reply first.
        What the engine caches of it goes at once (an undone delete computes it again: its
        text must not outlive a delete that is not undone). Returns it as it was (its title,
        for the notice)."""
        if conv_id is None:
            raise PageError("There is nothing to delete in a new chat.")
        self.stop(user, conv_id)
        openings = guard(self.store.openings, user, conv_id)
        gone = guard(self.store.mark_deleted, user, conv_id)
        for messages in openings:
            try:
                self.engines.forget_conversation(self.owner(user), messages)
            except RequestError as e:  # an engine not serving keeps nothing to forget
                log.info("a deleted conversation's cache entries not forgotten: %s", e)
        return gone

    def undo_delete(self, user: User, conv_id: int | None) -> Conversation:
        if conv_id is None:
            raise PageError("There is nothing to undo.")
        try:
            return self.store.undelete_conversation(user, conv_id)
        except NotFound:
            raise PageError("Too late to undo: that chat is gone.") from None
        except StoreError as e:
            raise PageError(refusal(e)) from None

    def conversation(self, user: User, conv_id: int) -> Conversation:
        return guard(self.store.get_conversation, user, conv_id)

    def set_system_prompt(self, user: User, conv_id: int, text: str) -> Conversation:
        check_text(text, "system prompt")
        return guard(self.store.set_system_prompt, user, conv_id, text or "")

    # ---- sharing and export ----

    def share(self, user: User, conv_id: int | None) -> str:
        """The token of the chat's read-only link (the same until `unshare`); owner only."""
        if conv_id is None:
            raise PageError("Send a first message: there is nothing to share in a new chat yet.")
        return guard(self.store.share_conversation, user, conv_id)

    def share_token(self, user: User, conv_id: int | None) -> str | None:
        """The chat's live token, None when it is not shared."""
        return None if conv_id is None else guard(self.store.share_token, user, conv_id)

    def unshare(self, user: User, conv_id: int | None) -> bool:
        """End the chat's link: its token is "not found" from now on."""
        if conv_id is None:
            raise PageError("A new chat is not shared.")
        return guard(self.store.revoke_share, user, conv_id)

    def export(self, user: User, conv_id: int | None, fmt: str) -> tuple[str, str]:
        """The conversation as the store exports it ("md" or "json"), with a file name.
        Someone else's conversation is "not found"."""
        if conv_id is None or not visible_turns(guard(self.store.history, user, conv_id)):
            # a file of a title alone would be saved without a word, and look like nothing happened
            raise PageError("Send a first message: there is nothing to export in a new chat yet.")
        text = guard(self.store.export_conversation, user, conv_id, fmt)
        title = guard(self.store.get_conversation, user, conv_id).title
        stem = re.sub(r"[^A-Za-z0-9]+", "-", title).strip("-")[:TITLE_CHARS].strip("-").lower() or "chat"
        return f"radixchat-{conv_id}-{stem}.{fmt}", text

    # ---- messages ----

    def messages(self, user: User, conv_id: int | None) -> list[dict[str, Any]]:
        """What the chat area shows for a conversation (None: a new chat, empty): stored turns
        with their figures, and the reply being written, if any."""
        if conv_id is None:
            return []
        branch, figures = guard(self._turns, user, conv_id)
        run = self.running.get(conv_id)
        streaming = run.text if run is not None and run.live and run.user_id == user.id else None
        return chat_rows(branch, figures, streaming)

    def show_version(self, user: User, conv_id: int | None, message_id: int) -> list[dict[str, Any]]:
        """Bring a version of a message into view (‹ i/n ›) with the branch last written through
        it: what the chat area shows, and the model sees next, from now on."""
        conv_id = self._idle(user, conv_id)
        try:
            branch = self.store.show_version(user, conv_id, message_id)
        except NotFound:  # someone else's message, or chat, reads the same as a stale id
            raise PageError("That version is not in this chat any more. Reload the page.") from None
        except StoreError as e:
            raise PageError(refusal(e)) from None
        return chat_rows(branch, guard(self.store.request_metrics, (m.request for m in branch.messages)))

    def edit_text(self, user: User, conv_id: int | None, message_id: int) -> str:
        """The text of one of the user's messages in view, to edit and send again (`reply(edit=)`)."""
        conv_id = self._idle(user, conv_id)
        branch, _ = guard(self._turns, user, conv_id)
        mine = next((m for m in branch.messages if m.id == message_id and m.role == "user"), None)
        if mine is None:
            raise PageError("That message is not in this chat any more. Reload the page.")
        return mine.content

    def _idle(self, user: User, conv_id: int | None) -> int:
        """Refuse to change a chat's branch while a reply is being written in it; the chat."""
        if conv_id is None:
            raise PageError("There is nothing to change in a new chat.")
        if self.writing(user, conv_id):
            raise PageError("A reply is still being written in this chat: wait for it or press Stop.")
        return conv_id
