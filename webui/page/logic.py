"""What the chat page does, without the page: the sidebar's chats, replies, stop, export, readable errors.

`ChatPage` holds the store, the engine and the metrics, and every method takes the signed-in
user, so the page (webui/page/layout.py) is only layout and wiring, and these can be tested without
a browser. The sidebar lists all of the user's conversations, newest first (the store's
"archived" means nothing here: an archived one is listed like any other), or, with a search,
those whose title or messages hold its words (the store's full-text index). "New chat" makes
nothing: the first message of a new chat (`reply` with no conversation) starts one, in the
user's empty untitled conversation if there is one, so empty chats never pile up and a new chat
never inherits another's system prompt. Delete hides a conversation at once and can be undone
for a while (the store's `mark_deleted`). The conversation opened last, in any browser, is noted
in the store and opens on the next load. Everything shown comes from SQLite.

A reply streams from the engine; it is stored with its request metrics when it ends,
finished, stopped or failed, exactly once, also when the page goes away mid-stream or while
it is being stored: the page hands that to a RequestEnd (webui/request_end.py) the moment the
engine takes the request. Per message the page reads the store once, before the reply, and
writes the message and the reply; what the chat area shows meanwhile and afterwards is
built from what it already holds, each message through one function (`row`: its text as
Markdown of text, code and links only, webui/page/markup.py). Stop cancels the request in
the engine. A conversation is a tree of messages in the store, one branch of it in view:
Regenerate writes another answer to the last message, and a message edited and sent again is a
new version of it (`reply(edit=)`); either way the new version is shown, and the older ones stay
and can be shown again (`show_version`, the "‹ i/n ›" under a message, webui/page/versions.py),
what follows them with them. The branch shown is the branch the model sees next.
Export hands out the store's own Markdown and JSON exports of a chat. Refusals (queue full,
prompt too long, engine down, bad input) raise `PageError` with a sentence meant for the
person at the page.

Threads: `reply` runs on the event loop and sends reads and writes to worker threads; the
other methods are synchronous and run where the page calls them (Gradio's worker threads).
No MLX here, no Gradio either.
"""

from __future__ import annotations

import asyncio
import functools
import html
import re
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from pydantic import ValidationError

from radixchat.core.engine.requests import ChatRequest, Failed, Finished, RequestError, Sampling, TextDelta, owner_of
from radixchat.core.store import (
    DEFAULT_TITLE,
    AlreadyExists,
    Branch,
    Conversation,
    Message,
    NotFound,
    RequestFigures,
    RequestRecord,
    Store,
    StoreError,
    User,
)
from radixchat.webui.page import markup, versions
from radixchat.webui.request_end import RequestEnd

if TYPE_CHECKING:
    from radixchat.core.engine.handle import RequestHandle
    from radixchat.core.engine.seam import EngineClient
    from radixchat.webui.api.metrics import Metrics

LOCAL_USER = "local"  # who everyone is with --no-auth
TITLE_CHARS = 40  # a new chat is named after the start of its first message
SEARCH_HITS = 50  # the most conversations a search lists
LISTED = 200  # the most conversations the sidebar lists
STREAM_EVERY_S = 0.05  # at most this often a streaming reply is sent to the browser


class PageError(Exception):
    """Something the person at the page should read (shown as a notice, never a traceback)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def refusal(e: Exception) -> str:
    """A readable sentence for why the engine or the store refused a request."""
    if isinstance(e, RequestError):
        if e.status == 429:
            return f"The server is busy ({e.message}). Try again in a moment."
        if e.status == 413:
            return f"This is too long for the model: {e.message}. Start a new chat or send a shorter message."
        if e.status == 503:
            return f"The model is not available right now: {e.message}."
        return f"The engine refused this request: {e.message}."
    if isinstance(e, ValidationError):
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"Invalid setting {where}: {first['msg']}."
    if isinstance(e, NotFound):
        return "This chat no longer exists (deleted in another window?). Reload the page."
    if isinstance(e, StoreError):
        return str(e)[:1].upper() + str(e)[1:] + "."
    return f"Something went wrong: {type(e).__name__}: {e}."


def stats_line(f: RequestFigures) -> str:
    """What is shown under an answer."""
    parts = []
    if f.ttft_ms is not None:
        parts.append(f"first token {f.ttft_ms:,.0f} ms")
    if f.decode_tps:
        parts.append(f"{f.decode_tps:.1f} tok/s")
    parts.append(f"{f.cached_tokens} of {f.prompt_tokens} prompt tokens from cache")
    if f.finish_reason == "cancelled":
        parts.append("stopped")
    elif f.finish_reason == "length":
        parts.append("length limit")
    if f.error:
        parts.append(f"failed: {f.error}")
    return " · ".join(parts)


def visible_turns(history: list[Message] | tuple[Message, ...]) -> list[Message]:
    """The branch in view as shown and as the model sees it: its user and assistant messages
    (the store's history is one branch: other versions of a message are not in it)."""
    return [m for m in history if m.role != "system"]


def prompt_of(conv: Conversation, turns: list[Message]) -> list[dict]:
    head = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
    return head + [{"role": m.role, "content": m.content} for m in turns]


def title_from(text: str) -> str:
    words = " ".join(text.split())
    return words if len(words) <= TITLE_CHARS else words[: TITLE_CHARS - 1].rstrip() + "…"


def row(
    role: str, text: str, figures: RequestFigures | None = None, streaming: bool = False, controls: str = ""
) -> dict:
    """One message as the chat area shows it. Its text goes through `markup.shown` here and
    nowhere else, for stored turns and a reply being written alike, so HTML in a message or
    a reply shows as typed and nothing in it is fetched. Under an answer: its figures, or a
    cursor while it is being written; under a stored message, its `controls` (versions.py:
    made here, never from a message's text)."""
    body = markup.shown(text)
    if role == "user":
        return {"role": "user", "content": body + controls}
    if not text.strip():
        body = "…" if streaming else "*(no text)*"
    if streaming:
        body += " ▍"
    elif figures is not None:
        body += f'\n\n<span class="rc-stats">{html.escape(stats_line(figures))}</span>'
    return {"role": "assistant", "content": body + controls}


def chat_rows(
    branch: Branch | list[Message], figures: dict[int, RequestFigures], streaming: str | None = None
) -> list[dict]:
    """What the chat area shows: the visible turns of the branch in view, each answer with its
    figures, each message with its versions (‹ i/n ›) and the user's with "Edit"; and, while a
    reply is being written (`streaming`: its text so far), that reply in place of the one it
    replaces, and no controls (nothing can be switched or edited until it ends)."""
    if not isinstance(branch, Branch):
        branch = Branch(tuple(branch))
    turns = visible_turns(branch.messages)
    if streaming is not None:
        while turns and turns[-1].role == "assistant":  # being regenerated
            turns.pop()
    idle = streaming is None
    out = [
        row(
            m.role,
            m.content,
            figures.get(m.request),
            controls=versions.controls(m.id, m.role, branch.versions.get(m.id, (m.id,)), editable=True) if idle else "",
        )
        for m in turns
    ]
    if streaming is not None:
        out.append(row("assistant", streaming, streaming=True))
    return out


@dataclass
class Running:
    """A reply being written in a chat: who asked, its engine handle, the text so far.
    Registered before anything is awaited, so a chat writes one reply at a time."""

    user_id: int
    handle: RequestHandle | None = None  # set once the engine took the request
    live: bool = False  # the user's message is stored: the chat shows this reply
    stopping: bool = False  # Stop was pressed (maybe before the engine had the request)
    text: str = ""
    started: float = field(default_factory=time.time)


class ChatPage:
    def __init__(
        self,
        engine: EngineClient,
        store: Store,
        metrics: Metrics | None = None,
        model_id: str = "",
        default_max_tokens: int = 256,
        signed_in: bool = True,
    ):
        self.engine, self.store, self.metrics = engine, store, metrics
        self.signed_in = signed_in  # False with --no-auth: everyone is the one local user
        card = engine.info.card
        self.top_p = float((card.sampling if card else {}).get("top_p", 1.0))  # the model card's
        self.model_id = model_id
        self.default_max_tokens = default_max_tokens
        self.running: dict[int, Running] = {}  # conversation id -> its reply being written
        self._claiming = threading.Lock()  # a new chat's conversation is picked and taken at once
        # the page's writes: a write handed here finishes even if the page (or its event
        # loop) is gone by then, and a RequestEnd can hand one over from the engine thread
        self._writes = ThreadPoolExecutor(max_workers=2, thread_name_prefix="radixchat-page-write")

    # ---- who ----

    def user(self, name: str | None) -> User:
        """The signed-in user; with no sign-in (--no-auth), the shared local user, made on first use."""
        if name:
            return self.store.get_user(name)
        try:
            return self.store.get_user(LOCAL_USER)
        except NotFound:
            try:
                return self.store.create_user(LOCAL_USER, secrets.token_urlsafe(24))
            except AlreadyExists:  # another request made it first
                return self.store.get_user(LOCAL_USER)

    def owner(self, user: User) -> str | None:
        """Whose requests these are, for the engine's cache scope and fair share (None: the
        one trusted user of --no-auth)."""
        return owner_of(user.id if self.signed_in else None)

    # ---- the sidebar ----

    def conversations(self, user: User) -> list[Conversation]:
        """The sidebar's list: every conversation of the user's, newest activity first."""
        return self._guard(self.store.list_conversations, user, archived=None, limit=LISTED)

    def find(self, user: User, query: str = "") -> list[tuple[str, int]]:
        """The sidebar's list as (label, conversation id): with no query, every conversation,
        newest first, by title; with one, those whose title or messages hold its words (the
        store's full-text search), best first, each labelled with its title and the piece of
        text that matched. Labels are plain text, shown as text."""
        if not (query or "").strip():
            return [(c.title, c.id) for c in self.conversations(user)]
        hits = self._guard(self.store.search_conversations, user, query, limit=SEARCH_HITS)
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
        conv = self._guard(self.store.open_conversation, user)
        if conv is None:
            newest = self._guard(self.store.list_conversations, user, archived=None, limit=1)
            conv = newest[0] if newest else None
        return None if conv is None else conv.id

    def show(self, user: User, conv_id: int) -> Conversation:
        """Open a conversation: it is the user's open one from now on (reload, other browsers)."""
        self._guard(self.store.set_open_conversation, user, conv_id)
        return self.conversation(user, conv_id)

    def new_chat(self, user: User, system_prompt: str = "", *, reuse: bool = True) -> Conversation:
        """A conversation to start a new chat in: the user's empty untitled one if there is one
        (no reply is being written there), else a new one; with `system_prompt`, nothing else
        of any other chat. `reuse=False` always makes a new one: for a caller that sends in it
        later, when another session of the same user may have been handed the same empty one."""
        if not reuse:
            return self._guard(self.store.create_conversation, user, None, system_prompt or "")
        with self._claiming:
            return self._guard(self.store.fresh_conversation, user, system_prompt or "", set(self.running))

    def _claim_new(self, user: User, system_prompt: str, run: Running) -> int:
        """`new_chat`, registering `run` there in the same step: two sends to new chats at once
        never share one."""
        with self._claiming:
            conv = self._guard(self.store.fresh_conversation, user, system_prompt or "", set(self.running))
            self.running[conv.id] = run
            return conv.id

    def rename(self, user: User, conv_id: int | None, title: str) -> Conversation:
        if conv_id is None:
            raise PageError("Send a first message: a new chat is named after it, and can be renamed then.")
        if not (title or "").strip():
            raise PageError("A chat's title can't be empty.")
        return self._guard(self.store.rename_conversation, user, conv_id, title)

    def delete(self, user: User, conv_id: int | None) -> Conversation:
        """Delete a conversation, undoably for a while (`undo_delete`); stops its reply first.
        Returns it as it was (its title, for the notice)."""
        if conv_id is None:
            raise PageError("There is nothing to delete in a new chat.")
        self.stop(user, conv_id)
        return self._guard(self.store.mark_deleted, user, conv_id)

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
        return self._guard(self.store.get_conversation, user, conv_id)

    def set_system_prompt(self, user: User, conv_id: int, text: str) -> Conversation:
        return self._guard(self.store.set_system_prompt, user, conv_id, text or "")

    def share(self, user: User, conv_id: int | None) -> str:
        """The token of the chat's read-only link (the same until `unshare`); owner only."""
        if conv_id is None:
            raise PageError("Send a first message: there is nothing to share in a new chat yet.")
        return self._guard(self.store.share_conversation, user, conv_id)

    def share_token(self, user: User, conv_id: int | None) -> str | None:
        """The chat's live token, None when it is not shared."""
        return None if conv_id is None else self._guard(self.store.share_token, user, conv_id)

    def unshare(self, user: User, conv_id: int | None) -> bool:
        """End the chat's link: its token is "not found" from now on."""
        if conv_id is None:
            raise PageError("A new chat is not shared.")
        return self._guard(self.store.revoke_share, user, conv_id)

    # ---- messages ----

    def messages(self, user: User, conv_id: int | None) -> list[dict]:
        """What the chat area shows for a conversation (None: a new chat, empty): stored turns
        with their figures, and the reply being written, if any."""
        if conv_id is None:
            return []
        branch, figures = self._guard(self._turns, user, conv_id)
        run = self.running.get(conv_id)
        live = run is not None and run.live and run.user_id == user.id
        return chat_rows(branch, figures, run.text if live else None)

    def show_version(self, user: User, conv_id: int | None, message_id: int) -> list[dict]:
        """Bring a version of a message into view (‹ i/n ›) with the branch last written through
        it: what the chat area shows, and the model sees next, from now on."""
        self._idle(user, conv_id)
        try:
            branch = self.store.show_version(user, conv_id, message_id)
        except NotFound:  # someone else's message, or chat, reads the same as a stale id
            raise PageError("That version is not in this chat any more. Reload the page.") from None
        except StoreError as e:
            raise PageError(refusal(e)) from None
        return chat_rows(branch, self._guard(self.store.request_metrics, (m.request for m in branch.messages)))

    def edit_text(self, user: User, conv_id: int | None, message_id: int) -> str:
        """The text of one of the user's messages in view, to edit and send again (`reply(edit=)`)."""
        self._idle(user, conv_id)
        branch, _ = self._guard(self._turns, user, conv_id)
        mine = next((m for m in branch.messages if m.id == message_id and m.role == "user"), None)
        if mine is None:
            raise PageError("That message is not in this chat any more. Reload the page.")
        return mine.content

    def _idle(self, user: User, conv_id: int | None) -> None:
        """Refuse to change a chat's branch while a reply is being written in it."""
        if conv_id is None:
            raise PageError("There is nothing to change in a new chat.")
        if self.writing(user, conv_id):
            raise PageError("A reply is still being written in this chat: wait for it or press Stop.")

    async def reply(
        self,
        user: User,
        conv_id: int | None,
        text: str | None,
        *,
        temperature: float = 0.0,
        max_tokens: int | None = None,
        regenerate: bool = False,
        edit: int | None = None,
        system_prompt: str = "",
        started: Callable[[int], None] | None = None,
    ) -> AsyncIterator[list[dict]]:
        """Send `text` (or, with regenerate, answer the last message again) and stream the
        reply: yields what the chat area shows, first at once, then as text arrives, last
        with the figures. Raises PageError when refused (nothing is stored then). The
        reply is stored when it ends, once, also when the page goes away mid-stream.
        With `edit` (one of the user's messages in view), `text` is a new version of it: the
        model sees the turns before it, then `text`; what followed the old version stays with it.

        `conv_id` None is a new chat: the message starts a conversation (`new_chat`, with
        `system_prompt`), whose id `started` is told before anything else happens there."""
        if conv_id is None:
            if regenerate:
                raise PageError("There is no message to answer again yet.")
            if edit is not None:
                raise PageError("There is no message to edit in a new chat.")
            if not (text or "").strip():
                raise PageError("Type a message first.")
            run = Running(user.id)
            claim = asyncio.ensure_future(asyncio.to_thread(self._claim_new, user, system_prompt, run))
            try:
                conv_id = await asyncio.shield(claim)
            except asyncio.CancelledError:  # the page went away: let go of what the claim takes
                claim.add_done_callback(
                    lambda f: (
                        f.cancelled()
                        or f.exception() is not None
                        or self.running.get(f.result()) is not run
                        or self.running.pop(f.result())
                    )
                )
                raise
            if started is not None:
                started(conv_id)
        else:
            busy = self.running.get(conv_id)
            if busy is not None:  # someone else's chat is "not found", busy or not
                raise PageError(
                    "A reply is still being written in this chat: wait for it or press Stop."
                    if busy.user_id == user.id
                    else refusal(NotFound(""))
                )
            run = self.running[conv_id] = Running(user.id)
        end: RequestEnd[tuple[Message, RequestFigures]] | None = None
        question: Future[Message] | None = None  # the user's message, being stored
        try:
            conv, branch, figures = await asyncio.to_thread(self._guard, self._tab, user, conv_id)
            turns = visible_turns(branch.messages)
            if regenerate:
                while turns and turns[-1].role == "assistant":
                    turns.pop()
                if not turns:
                    raise PageError("There is no message to answer again yet.")
                messages = prompt_of(conv, turns)
                answered = turns[-1].id
            else:
                if not (text or "").strip():
                    raise PageError("Type a message first.")
                if edit is not None:
                    at = next((i for i, m in enumerate(turns) if m.id == edit and m.role == "user"), None)
                    if at is None:
                        raise PageError("That message is not in this chat any more: press Edit on it again.")
                    turns = turns[:at]
                messages = prompt_of(conv, turns) + [{"role": "user", "content": text}]
            try:
                sampling = Sampling(
                    temperature=temperature, top_p=self.top_p, max_tokens=int(max_tokens or self.default_max_tokens)
                )
                # templated in a worker thread; the owner keeps this conversation in the user's
                # own part of the prefix cache and counts it against the user's share
                handle = run.handle = await self.engine.asubmit(
                    ChatRequest(messages=messages, sampling=sampling, owner=self.owner(user))
                )
            except (RequestError, ValidationError) as e:
                if self.metrics is not None:
                    self.metrics.rejected()
                raise PageError(refusal(e)) from None
            # the reply answers the message the model saw last; a question's id is known once
            # it is stored, which is before the reply is (RequestEnd keeps a reply only then)
            answers = (lambda: answered) if regenerate else (lambda: question.result().id)
            end = RequestEnd(
                handle,
                self.metrics,
                functools.partial(self._store_reply, user, conv_id, answers),
                executor=self._writes,
                reader=True,
            )
            if run.stopping:
                handle.cancel()
            if not regenerate:
                first = conv.title == DEFAULT_TITLE and not any(m.role == "user" for m in turns)
                # after the branch the model saw, even if another window shows another one now
                after = branch.messages[-1].id if branch.messages else None
                question = self._writes.submit(self._store_question, user, conv_id, text, first, edit, after)
                try:  # shielded: leaving now must not undo a write that may commit anyway
                    branch = branch.grow(await asyncio.shield(asyncio.wrap_future(question)))
                except StoreError as e:
                    raise PageError(refusal(e)) from None
            run.live = True
            shown = chat_rows(branch, figures, streaming="")
            yield shown
            final, last = None, time.monotonic()
            async for ev in handle:
                if isinstance(ev, TextDelta):
                    run.text += ev.text
                    if time.monotonic() - last >= STREAM_EVERY_S:
                        last = time.monotonic()
                        yield shown[:-1] + [row("assistant", run.text, streaming=True)]
                else:
                    final = ev
            self._let_go(end, question, run.text)
            try:
                stored = await end.wait()
            except StoreError as e:
                raise PageError(refusal(e)) from None
            self.running.pop(conv_id, None)
            if stored is not None:  # shown from what was written, not read back
                message, figures_of_reply = stored
                figures[message.request] = figures_of_reply
                branch = branch.grow(message)
            yield chat_rows(branch, figures)
            if isinstance(final, Failed):
                raise PageError(f"The reply failed: {final.message}. What it wrote so far is kept.")
        finally:
            if self.running.get(conv_id) is run:
                del self.running[conv_id]
            if end is not None and not end.released:  # the page went away (or failed) mid-reply
                run.handle.cancel()
                self._let_go(end, question, run.text)

    def writing(self, user: User, conv_id: int | None) -> bool:
        """Whether a reply of this user's is being written in this chat (its button reads Stop)."""
        run = self.running.get(conv_id) if conv_id is not None else None
        return run is not None and run.user_id == user.id

    def export(self, user: User, conv_id: int | None, fmt: str) -> tuple[str, str]:
        """The conversation as the store exports it ("md" or "json"), with a file name.
        Someone else's conversation is "not found"."""
        if conv_id is None:
            raise PageError("Send a first message: there is nothing to export in a new chat yet.")
        text = self._guard(self.store.export_conversation, user, conv_id, fmt)
        title = self._guard(self.store.get_conversation, user, conv_id).title
        stem = re.sub(r"[^A-Za-z0-9]+", "-", title).strip("-")[:TITLE_CHARS].strip("-").lower() or "chat"
        return f"radixchat-{conv_id}-{stem}.{fmt}", text

    def stop(self, user: User, conv_id: int) -> bool:
        """Cancel the reply being written in this chat, in the engine. False if there is none."""
        run = self.running.get(conv_id)
        if run is None or run.user_id != user.id:
            return False
        run.stopping = True
        if run.handle is not None:
            run.handle.cancel()
        return True

    @staticmethod
    def _let_go(end: RequestEnd, question: Future[Message] | None, text: str) -> None:
        """Hand the reply to its RequestEnd: stored if the user's message is (a regenerated
        reply answers one that is). A question still being written decides once it is."""
        if question is None:
            end.release(text)
        else:
            question.add_done_callback(lambda q: end.release(text, keep=not q.cancelled() and q.exception() is None))

    def _tab(self, user: User, conv_id: int) -> tuple[Conversation, Branch, dict[int, RequestFigures]]:
        """Everything a reply starts from, in one trip to a worker thread."""
        conv = self.store.get_conversation(user, conv_id)
        return (conv, *self._turns(user, conv_id))

    def _turns(self, user: User, conv_id: int) -> tuple[Branch, dict[int, RequestFigures]]:
        branch = self.store.branch(user, conv_id)
        return branch, self.store.request_metrics(m.request for m in visible_turns(branch.messages))

    def _store_question(
        self, user: User, conv_id: int, text: str, first: bool, edit: int | None, after: int | None
    ) -> Message:
        """The user's message, after `after`, or as a new version of the message `edit`; the
        first one also names the chat. The chat written in is the one a reload opens."""
        if edit is not None:
            message = self.store.edit_message(user, conv_id, edit, text)
        else:
            message = self.store.append_message(user, conv_id, "user", text, after=after)
        if first:
            self.store.rename_conversation(user, conv_id, title_from(text))
        self.store.set_open_conversation(user, conv_id)
        return message

    def _store_reply(
        self, user: User, conv_id: int, answers: Callable[[], int], final: Finished | Failed, text_so_far: str
    ) -> tuple[Message, RequestFigures] | None:
        """A reply that ended (finished, stopped or failed), with its request metrics, and
        the figures that will be read back for it; None when its chat was deleted meanwhile
        (Delete stops the reply: there is nothing left to store it in)."""
        text = final.text if isinstance(final, Finished) else text_so_far
        record = RequestRecord.from_usage(
            final.usage,
            model=self.model_id,
            finish_reason=final.finish_reason if isinstance(final, Finished) else "error",
            error=final.message if isinstance(final, Failed) else None,
        )
        try:
            return self.store.append_reply(user, conv_id, text, record, parent=answers()), record.figures()
        except NotFound:
            self.store.record_request_async(replace(record, user=user.id))  # the figures stay
            return None

    @staticmethod
    def _guard(fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except StoreError as e:
            raise PageError(refusal(e)) from None
