"""The page's replies: a message sent (or answered again, or edited), the reply streamed, and
its end stored once.

A mixin of `ChatPage` (webui/page/logic.py), over its engines, store, metrics and writer
threads; the chats it writes in are webui/page/chats.py's. A reply streams from the engine of
its chat's model (webui/page/model_pick.py: the chat's own while served, else the first; a new
chat's is the one picked for it), sampled with the top-p that model's card recommends;
it is stored with its request metrics when it ends, finished, stopped or failed, exactly
once, also when the page goes away mid-stream or while it is being stored: the page hands
that to a RequestEnd (webui/request_end.py) the moment the engine takes the request. Per
message the page reads the store once, before the reply, and writes the message and the
reply; what the chat area shows meanwhile and afterwards is built from what it already holds
(webui/page/rows.py). Stop cancels the request in the engine. Regenerate writes another
answer to the last message, and a message edited and sent again is a new version of it
(`reply(edit=)`); either way the new version is shown, and the older ones stay.

Threads: `reply` runs on the event loop and sends reads and writes to worker threads; the
page's writes run on its own two threads, so they finish even if the page is gone by then;
`stop` and `writing` run where the page calls them. No MLX, no Gradio.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from pydantic import ValidationError

from radixchat.core.engine.requests import ChatRequest, Failed, Finished, RequestError, Sampling, TextDelta
from radixchat.core.store import (
    DEFAULT_TITLE,
    Branch,
    Conversation,
    Message,
    NotFound,
    RequestFigures,
    RequestRecord,
    StoreError,
    User,
)
from radixchat.webui.page.errors import PageError, check_text, guard, refusal
from radixchat.webui.page.rows import chat_rows, row, visible_turns
from radixchat.webui.request_end import RequestEnd

if TYPE_CHECKING:
    from radixchat.core.engine.handle import RequestHandle
    from radixchat.core.engine.seam import EngineClient

TITLE_CHARS = 40  # a new chat is named after the start of its first message
STREAM_EVERY_S = 0.05  # at most this often a streaming reply is sent to the browser


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


def prompt_of(conv: Conversation, turns: list[Message]) -> list[dict]:
    head = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
    return head + [{"role": m.role, "content": m.content} for m in turns]


def title_from(text: str) -> str:
    """A new chat's name: its first message, cut at the last word boundary that fits (a word
    longer than half the room is cut where the room ends)."""
    words = " ".join(text.split())
    if len(words) <= TITLE_CHARS:
        return words
    cut = words[: TITLE_CHARS - 1]
    space = cut.rfind(" ", 0, TITLE_CHARS)
    if words[TITLE_CHARS - 1] != " " and space >= TITLE_CHARS // 2:
        cut = cut[:space]
    return cut.rstrip(" ,.;:-") + "…"


def prompt_for(
    conv: Conversation, branch: Branch, text: str | None, *, regenerate: bool, edit: int | None
) -> tuple[list[Message], list[dict], int | None]:
    """What the model is sent: the turns it sees before the new message (those before the
    edited one, with `edit`), and the messages; answering again, the turns up to the last
    question, and that question's id."""
    turns = visible_turns(branch.messages)
    if regenerate:
        while turns and turns[-1].role == "assistant":
            turns.pop()
        if not turns:
            raise PageError("There is no message to answer again yet.")
        return turns, prompt_of(conv, turns), turns[-1].id
    if not (text or "").strip():
        raise PageError("Type a message first.")
    if edit is not None:
        at = next((i for i, m in enumerate(turns) if m.id == edit and m.role == "user"), None)
        if at is None:
            raise PageError("That message is not in this chat any more: press Edit on it again.")
        turns = turns[:at]
    return turns, prompt_of(conv, turns) + [{"role": "user", "content": text}], None


async def stored(question: Future[Message]) -> Message:
    """The user's message once it is stored."""
    try:  # shielded: leaving now must not undo a write that may commit anyway
        return await asyncio.shield(asyncio.wrap_future(question))
    except StoreError as e:
        raise PageError(refusal(e)) from None


class Replies:
    """ChatPage's replies: one at a time per chat (`running`), each stored once."""

    def writing(self, user: User, conv_id: int | None) -> bool:
        """Whether a reply of this user's is being written in this chat (its button reads Stop)."""
        run = self.running.get(conv_id) if conv_id is not None else None
        return run is not None and run.user_id == user.id

    def stop(self, user: User, conv_id: int) -> bool:
        """Cancel the reply being written in this chat, in the engine. False if there is none."""
        run = self.running.get(conv_id)
        if run is None or run.user_id != user.id:
            return False
        run.stopping = True
        if run.handle is not None:
            run.handle.cancel()
        return True

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
        model: str | None = None,
    ) -> AsyncIterator[list[dict]]:
        """Send `text` (or, with regenerate, answer the last message again) and stream the
        reply: yields what the chat area shows, first at once, then as text arrives, last
        with the figures. Raises PageError when refused (nothing is stored then). The
        reply is stored when it ends, once, also when the page goes away mid-stream.
        With `edit` (one of the user's messages in view), `text` is a new version of it: the
        model sees the turns before it, then `text`; what followed the old version stays with it.

        `conv_id` None is a new chat: the message starts a conversation (`new_chat`, with
        `system_prompt` and `model`), whose id `started` is told before anything else happens
        there. The reply is written by the chat's model (`model_of`), loaded now if it is not."""
        conv_id, run = await self._take(user, conv_id, text, regenerate, edit, system_prompt, model, started)
        end: RequestEnd[tuple[Message, RequestFigures]] | None = None
        question: Future[Message] | None = None  # the user's message, being stored
        try:
            conv, branch, figures = await asyncio.to_thread(guard, self._tab, user, conv_id)
            turns, messages, answered = prompt_for(conv, branch, text, regenerate=regenerate, edit=edit)
            engine = await self.engine_for(self.model_of(conv))
            handle = run.handle = await self._submit(user, engine, messages, temperature, max_tokens)
            # the reply answers the message the model saw last; a question's id is known once
            # it is stored, which is before the reply is (RequestEnd keeps a reply only then)
            answers = (lambda: answered) if regenerate else (lambda: question.result().id)
            served_by = engine.info.model_id
            end = RequestEnd(
                handle,
                self.metrics,
                functools.partial(self._store_reply, user, conv_id, answers, served_by),
                executor=self._writes,
                reader=True,
                model=served_by,
            )
            if run.stopping:
                handle.cancel()
            if not regenerate:
                question = self._ask(user, conv, branch, turns, text, edit)
                branch = branch.grow(await stored(question))
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
            branch = await self._ended(end, question, run, conv_id, branch, figures)
            yield chat_rows(branch, figures)
            if isinstance(final, Failed):
                raise PageError(f"The reply failed: {final.message}. What it wrote so far is kept.")
        finally:
            if self.running.get(conv_id) is run:
                del self.running[conv_id]
            if end is not None and not end.released:  # the page went away (or failed) mid-reply
                run.handle.cancel()
                self._let_go(end, question, run.text)

    async def _take(
        self,
        user: User,
        conv_id: int | None,
        text: str | None,
        regenerate: bool,
        edit: int | None,
        system_prompt: str,
        model: str | None,
        started: Callable[[int], None] | None,
    ) -> tuple[int, Running]:
        """The chat the reply is written in, its `Running` registered there before anything
        is awaited in a chat the page named; a new chat is claimed (with `system_prompt` and
        `model`), and `started` told."""
        check_text(text, "message")
        check_text(system_prompt, "system prompt")
        if conv_id is not None:
            busy = self.running.get(conv_id)
            if busy is not None:  # someone else's chat is "not found", busy or not
                raise PageError(
                    "A reply is still being written in this chat: wait for it or press Stop."
                    if busy.user_id == user.id
                    else refusal(NotFound(""))
                )
            run = self.running[conv_id] = Running(user.id)
            return conv_id, run
        if regenerate:
            raise PageError("There is no message to answer again yet.")
        if edit is not None:
            raise PageError("There is no message to edit in a new chat.")
        if not (text or "").strip():
            raise PageError("Type a message first.")
        run = Running(user.id)
        claim = asyncio.ensure_future(asyncio.to_thread(self._claim_new, user, system_prompt, model, run))
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
        return conv_id, run

    def _claim_new(self, user: User, system_prompt: str, model: str | None, run: Running) -> int:
        """`new_chat`, registering `run` there in the same step: two sends to new chats at once
        never share one."""
        model = self.served_name(model)  # one not served: the first model's, as for no pick
        with self._claiming:
            conv = guard(self.store.fresh_conversation, user, system_prompt or "", set(self.running), model=model)
            self.running[conv.id] = run
            return conv.id

    async def _submit(
        self, user: User, engine: EngineClient, messages: list[dict], temperature: float, max_tokens: int | None
    ) -> RequestHandle:
        """The request, taken by `engine`; a refusal is counted and raised as a PageError."""
        try:
            sampling = Sampling(
                temperature=temperature,
                top_p=self.top_p_of(engine),
                max_tokens=int(max_tokens or self.default_max_tokens),
                **self.penalties_of(engine),
            )
            # templated in a worker thread; the owner keeps this conversation in the user's
            # own part of the prefix cache and counts it against the user's share
            return await engine.asubmit(ChatRequest(messages=messages, sampling=sampling, owner=self.owner(user)))
        except (RequestError, ValidationError) as e:
            if self.metrics is not None:
                self.metrics.rejected()
            raise PageError(refusal(e)) from None

    def _ask(
        self, user: User, conv: Conversation, branch: Branch, turns: list[Message], text: str, edit: int | None
    ) -> Future[Message]:
        """The user's message, handed to the page's writes; a first message names the chat."""
        first = conv.title == DEFAULT_TITLE and not any(m.role == "user" for m in turns)
        # after the branch the model saw, even if another window shows another one now
        after = branch.messages[-1].id if branch.messages else None
        return self._writes.submit(self._store_question, user, conv.id, text, first, edit, after)

    async def _ended(
        self,
        end: RequestEnd,
        question: Future[Message] | None,
        run: Running,
        conv_id: int,
        branch: Branch,
        figures: dict[int, RequestFigures],
    ) -> Branch:
        """The reply handed over and stored; the branch with it, and its figures added, shown
        from what was written, not read back."""
        self._let_go(end, question, run.text)
        try:
            kept = await end.wait()
        except StoreError as e:
            raise PageError(refusal(e)) from None
        self.running.pop(conv_id, None)
        if kept is None:
            return branch
        message, figures_of_reply = kept
        figures[message.request] = figures_of_reply
        return branch.grow(message)

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
        self,
        user: User,
        conv_id: int,
        answers: Callable[[], int],
        model: str,
        final: Finished | Failed,
        text_so_far: str,
    ) -> tuple[Message, RequestFigures] | None:
        """A reply that ended (finished, stopped or failed), with its request metrics under the
        model that wrote it, and the figures that will be read back for it; None when its chat
        was deleted meanwhile (Delete stops the reply: there is nothing left to store it in)."""
        text = final.text if isinstance(final, Finished) else text_so_far
        record = RequestRecord.from_usage(
            final.usage,
            model=model,
            finish_reason=final.finish_reason if isinstance(final, Finished) else "error",
            error=final.message if isinstance(final, Failed) else None,
        )
        try:
            return self.store.append_reply(user, conv_id, text, record, parent=answers()), record.figures()
        except NotFound:
            self.store.record_request_async(replace(record, user=user.id))  # the figures stay
            return None
