"""The page's replies: a message sent (or answered again, or edited), the reply streamed, and
its end stored once.

A part of `ChatPage` (webui/page/logic/chat_page.py), over the models (webui/page/logic/model_pick.py) and
the state every part shares (webui/page/logic/state.py: engines, store, metrics, writer threads); the chats it writes in are webui/page/logic/chats.py's. A reply streams from the engine of
its chat's model (webui/page/logic/model_pick.py: the chat's own while served, else the first; a new
chat's is the one picked for it), sampled with the top-p that model's card recommends;
it is stored with its request metrics when it ends, finished, stopped or failed, exactly
once. A reply is the server's, not a tab's: its writing runs as a task of its own
(webui/page/logic/live.py), from the request to its stored end, and the tab that sent it only
watches it, as a tab that opens its chat meanwhile does (`live`); a tab that goes away (a
reload, a closed tab) leaves it running to its end or to Stop, which any tab of its user may
press. Its end is handed to a RequestEnd (webui/request_end.py) the moment the engine takes
the request, so it is stored once even if the event loop closes mid-stream. Per
message the page reads the store once, before the reply, and writes the message and the
reply; what the chat area shows meanwhile and afterwards is built from what it already holds
(webui/page/logic/rows.py). Stop cancels the request in the engine. Regenerate writes another
answer to the last message, Continue (`reply(go_on=)`) an answer that goes on from where the
last one was cut (by the length limit, or Stop): its text, then more, as one message; and a
message edited and sent again is a new version of it (`reply(edit=)`). Each way the new
version is shown, and the older ones stay.

Threads: a reply's writing and its watchers run on the event loop and send reads and writes
to worker threads; the page's writes run on its own two threads, so they finish even if the
page is gone by then; `stop`, `writing` and `live` run where the page calls them. No MLX, no
Gradio.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from radixchat.core.seam.requests import ChatRequest, Failed, Finished, RequestError, Sampling, TextDelta
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
from radixchat.webui.page.logic.errors import PageError, check_text, guard, refusal
from radixchat.webui.page.logic.live import LiveReply, start
from radixchat.webui.page.logic.model_pick import ModelPick
from radixchat.webui.page.logic.rows import chat_rows, figures_of, row, visible_turns
from radixchat.webui.request_end import RequestEnd

if TYPE_CHECKING:
    from radixchat.core.seam.handle import RequestHandle
    from radixchat.core.seam.protocol import EngineClient

log = logging.getLogger("radixchat.page")

TITLE_CHARS = 40  # a new chat is named after the start of its first message
STREAM_EVERY_S = 0.05  # at most this often a streaming reply is sent to the browser


@dataclass(frozen=True)
class Asked:
    """What a send asked for (`reply`'s arguments), handed to the reply's writing."""

    text: str | None
    temperature: float
    max_tokens: int | None
    regenerate: bool
    edit: int | None
    system_prompt: str
    started: Callable[[int], None] | None
    model: str | None
    go_on: bool = False  # Continue: the last answer, then more

    @property
    def again(self) -> bool:
        """It answers a message already stored (Regenerate, Continue): no new one is written."""
        return self.regenerate or self.go_on


def prompt_of(conv: Conversation, turns: list[Message]) -> list[dict[str, Any]]:
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
) -> tuple[list[Message], list[dict[str, Any]], int | None]:
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


def going_on(conv: Conversation, branch: Branch) -> tuple[list[Message], list[dict[str, Any]], int, str]:
    """What Continue sends: the turns before the last answer, then that answer's text, for the
    model to go on from (ChatRequest.continue_final); the message it answers, and its text (less
    the whitespace at its end, which the model writes again if it belongs there)."""
    turns = visible_turns(branch.messages)
    if not turns or turns[-1].role != "assistant":
        raise PageError("There is no answer to continue yet.")
    *before, cut = turns
    text = cut.content.rstrip()
    if not text or not before:
        raise PageError("The last answer has no text to go on from: press Regenerate.")
    return before, prompt_of(conv, turns[:-1]) + [{"role": "assistant", "content": text}], before[-1].id, text


def waiting(
    turns: list[Message], figures: dict[int, RequestFigures], asked: str | None, why: str
) -> list[dict[str, Any]]:
    """What the chat area shows before a reply can begin: the turns the model will see, the
    message being sent (`asked`), and in the reply's place why it has not begun."""
    rows = [row(m.role, m.content, figures_of(m, figures)) for m in turns]
    if asked is not None:
        rows.append(row("user", asked))
    # not chat_rows: with text streaming, it drops the answers at the end (they are being
    # written again), and a new message's turns end with the answer before it
    return [*rows, row("assistant", f"*{why}*", streaming=True)]


async def stored(question: Future[Message]) -> Message:
    """The user's message once it is stored."""
    try:  # shielded: leaving now must not undo a write that may commit anyway
        return await asyncio.shield(asyncio.wrap_future(question))
    except StoreError as e:
        raise PageError(refusal(e)) from None


class Replies(ModelPick):
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
        go_on: bool = False,
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """Send `text` (or, with regenerate, answer the last message again; with go_on, write
        the last answer again as itself and what follows it) and stream the reply: yields what the chat area shows, first at once, then as text arrives, last
        with the figures. Raises PageError when refused (nothing is stored then).
        The reply is the server's (`_write`, started here): leaving this stream (the page
        went away) leaves it running; it is stored when it ends, once, watched or not.
        With `edit` (one of the user's messages in view), `text` is a new version of it: the
        model sees the turns before it, then `text`; what followed the old version stays with it.

        `conv_id` None is a new chat: the message starts a conversation (`new_chat`, with
        `system_prompt` and `model`), whose id `started` is told before anything else happens
        there. The reply is written by the chat's model (`model_of`), loaded now if it is not."""
        run = LiveReply(user.id)
        ask = Asked(text, temperature, max_tokens, regenerate, edit, system_prompt, started, model, go_on)
        start(self._write(run, user, conv_id, ask))
        async for rows in run.watch():
            yield rows

    def live(self, user: User, conv_id: int | None) -> LiveReply | None:
        """The reply being written in this chat of the user's, for another tab to watch; None
        when there is none, or the chat is someone else's."""
        run = self.running.get(conv_id) if conv_id is not None else None
        return run if run is not None and run.user_id == user.id else None

    async def _write(self, run: LiveReply, user: User, conv_id: int | None, ask: Asked) -> None:
        """A reply's whole life, as a task no tab owns (live.py's `start`): the chat taken, the
        request, the user's message stored, the stream, the end stored; what the chat area
        shows on the way, and the end, go to `run`'s watchers. A refusal ends `run` with it."""
        end: RequestEnd[tuple[Message, RequestFigures] | None] | None = None
        question: Future[Message] | None = None  # the user's message, being stored
        answered: int | None  # the message a reply to a stored one answers
        try:
            conv_id = await self._take(user, conv_id, ask, run)
            conv, branch, figures = await asyncio.to_thread(guard, self._tab, user, conv_id)
            if ask.go_on:
                turns, messages, answered, run.text = going_on(conv, branch)
            else:
                turns, messages, answered = prompt_for(conv, branch, ask.text, regenerate=ask.regenerate, edit=ask.edit)
            model = self.model_of(conv)
            if self.loaded_info(model) is None:  # its load takes seconds: say why nothing comes yet
                run.show(waiting(turns, figures, None if ask.again else ask.text, f"Loading {model} for this reply…"))
            engine = await self.engine_for(model)
            handle = run.handle = await self._submit(
                user, engine, messages, ask.temperature, ask.max_tokens, go_on=ask.go_on
            )

            def answers() -> int:
                """The message the reply answers: the one the model saw last. A question's id
                is known once it is stored, which is before the reply is (RequestEnd keeps a
                reply only then)."""
                if ask.again:
                    assert answered is not None
                    return answered
                assert question is not None
                return question.result().id

            served_by = engine.info.model_id
            end = RequestEnd(
                handle,
                self.metrics,
                functools.partial(self._store_reply, user, conv_id, answers, served_by, run.text),
                executor=self._writes,
                reader=True,
                model=served_by,
            )
            if run.stopping:
                handle.cancel()
            if not ask.again:
                question = self._ask(user, conv, branch, turns, ask.text or "", ask.edit)
                branch = branch.grow(await stored(question))
            run.live = True
            shown = chat_rows(branch, figures, streaming=run.text)
            run.show(shown)
            final = await self._stream(run, handle, shown)
            branch = await self._ended(end, question, run, conv_id, branch, figures)
            why = (
                PageError(f"The reply failed: {final.message}. What it wrote so far is kept.")
                if isinstance(final, Failed)
                else None
            )
            run.end(chat_rows(branch, figures), why)
        except PageError as e:
            run.end(error=e)
        except asyncio.CancelledError:  # the event loop is closing: what was written is stored
            run.end(error=PageError("The server stopped this reply. What it wrote so far is kept."))
            raise
        except Exception as e:
            log.exception("a reply of the page failed")
            run.end(error=e)
        finally:
            run.end()  # never leaves a watcher waiting
            if conv_id is not None and self.running.get(conv_id) is run:
                del self.running[conv_id]
            if end is not None and not end.released and run.handle is not None:  # failed mid-reply
                run.handle.cancel()
                self._let_go(end, question, run.text)

    @staticmethod
    async def _stream(run: LiveReply, handle: RequestHandle, shown: list[dict[str, Any]]) -> Finished | Failed | None:
        """The engine's events into `run`'s text, shown at most every STREAM_EVERY_S; the last event."""
        final, last = None, time.monotonic()
        async for ev in handle:
            if isinstance(ev, TextDelta):
                run.text += ev.text
                if time.monotonic() - last >= STREAM_EVERY_S:
                    last = time.monotonic()
                    run.show(shown[:-1] + [row("assistant", run.text, streaming=True)])
            else:
                final = ev
        return final

    async def _take(self, user: User, conv_id: int | None, ask: Asked, run: LiveReply) -> int:
        """The chat the reply is written in, `run` registered there before anything is
        awaited in a chat the page named; a new chat is claimed (with the system prompt and
        model asked for), and `started` told."""
        check_text(ask.text, "message")
        check_text(ask.system_prompt, "system prompt")
        if conv_id is not None:
            busy = self.running.get(conv_id)
            if busy is not None:  # someone else's chat is "not found", busy or not
                raise PageError(
                    "A reply is still being written in this chat: wait for it or press Stop."
                    if busy.user_id == user.id
                    else refusal(NotFound(""))
                )
            self.running[conv_id] = run
            return conv_id
        if ask.again:
            raise PageError("There is no message to answer again yet.")
        if ask.edit is not None:
            raise PageError("There is no message to edit in a new chat.")
        if not (ask.text or "").strip():
            raise PageError("Type a message first.")
        claim = asyncio.ensure_future(asyncio.to_thread(self._claim_new, user, ask.system_prompt, ask.model, run))
        try:
            conv_id = await asyncio.shield(claim)
        except asyncio.CancelledError:  # the event loop is closing: let go of what the claim takes
            claim.add_done_callback(
                lambda f: (
                    f.cancelled()
                    or f.exception() is not None
                    or self.running.get(f.result()) is not run
                    or self.running.pop(f.result())
                )
            )
            raise
        if ask.started is not None:
            ask.started(conv_id)
        return conv_id

    def _claim_new(self, user: User, system_prompt: str, model: str | None, run: LiveReply) -> int:
        """`new_chat`, registering `run` there in the same step: two sends to new chats at once
        never share one."""
        model = self.served_name(model)  # one not served: the first model's, as for no pick
        with self._claiming:
            conv = guard(self.store.fresh_conversation, user, system_prompt or "", set(self.running), model=model)
            self.running[conv.id] = run
            return conv.id

    async def _submit(
        self,
        user: User,
        engine: EngineClient,
        messages: list[dict[str, Any]],
        temperature: float,
        max_tokens: int | None,
        *,
        go_on: bool = False,
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
            request = ChatRequest(
                messages=messages,
                sampling=sampling,
                owner=self.owner(user),
                owner_limit=user.request_limit,
                continue_final=go_on,
            )
            handle = await engine.asubmit(request)
        except (RequestError, ValidationError) as e:
            if self.metrics is not None:
                self.metrics.rejected()
            raise PageError(refusal(e)) from None
        if self.live_requests is not None and self.signed_in:
            self.live_requests.track(handle, user.id)
        return handle

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
        end: RequestEnd[tuple[Message, RequestFigures] | None],
        question: Future[Message] | None,
        run: LiveReply,
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
        assert message.request is not None  # a reply is stored with its request's row (append_reply)
        figures[message.request] = figures_of_reply
        return branch.grow(message)

    @staticmethod
    def _let_go(
        end: RequestEnd[tuple[Message, RequestFigures] | None], question: Future[Message] | None, text: str
    ) -> None:
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
        went_on: str,
        final: Finished | Failed,
        text_so_far: str,
    ) -> tuple[Message, RequestFigures] | None:
        """A reply that ended (finished, stopped or failed), with its request metrics under the
        model that wrote it, and the figures that will be read back for it; None when its chat
        was deleted meanwhile (Delete stops the reply: there is nothing left to store it in).
        A reply that went on from a cut answer (`went_on`, its text) is stored whole, as one."""
        text = went_on + final.text if isinstance(final, Finished) else text_so_far
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
