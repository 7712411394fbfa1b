"""Sending from the page: a message (Enter or Send), Regenerate, Continue, Stop, following a reply
sent before (`follow_reply`), and the two events scripted clients send (`new_tab`, `respond`).

A reply streams into the chat area while its chat is in view; it keeps streaming when its
chat is left, and the chat area shows the one in view meanwhile. The reply is the server's
(webui/page/logic/live.py): a send only watches it, and so does a tab whose chat comes into view
while it is being written (a reload, a second tab, another device of the same user), which
reads Stop until it ends; leaving stops no reply, Stop in any of them does. A message to a
new chat carries the model picked in the browser, which the chat it makes takes. The one
button reads Stop while a reply is being written in the chat in view. A part of the page's
handlers (webui/page/events/handlers.py); which components a send's values go to is
webui/page/events/wiring.py's (`replying`, in the order of `REPLYING`; `FOLLOWING`), the reply
itself ChatPage's (webui/page/logic/replies.py). Runs on the server's event loop (the sends,
following) and Gradio's worker threads (Stop, `new_tab`). No MLX.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import gradio as gr

from radixchat.webui.page.events.view import SHOWN, STOP, PageView, Skip, View, notice, notices, skip_output
from radixchat.webui.page.logic.errors import PageError

if TYPE_CHECKING:
    from radixchat.core.store import User

# what a send yields, in this order (wiring.py's `replying`)
REPLYING = ("chatbot", "message", "conv_list", "title", "send", "current", "edit_bar")
# what following a reply yields, in this order (wiring.py's `following`)
FOLLOWING = ("chatbot", "send")


class Send:
    """One send as the page draws it: the chat it made (a new chat), whether its first rows
    are out, whether its chat was in view at its last rows, and how the button read."""

    reads_stop: bool | None  # None: the button has not been drawn yet

    def __init__(self, page: PageView, user: User, view: View, stamp: int | None, query: str, *, again: bool):
        self.page, self.user, self.view = page, user, view
        self.stamp, self.query, self.again = stamp, query, again
        self.editing = view.editing  # an edit under way, in this chat or another
        self.made: list[int] = []
        self.opened, self.visible, self.reads_stop = False, True, None

    def edit_of(self, conv_id: int | None) -> int | None:
        """The message this one is a new version of: the one whose Edit was pressed in this chat."""
        editing = self.editing
        return editing[1] if editing and not self.again and editing[0] == conv_id else None

    def started(self, new_id: int) -> None:
        """The chat this message made: in view, unless the browser moved on meanwhile."""
        self.made.append(new_id)
        self.view.follow(new_id, self.stamp)

    def button(self) -> gr.Button | Skip:
        """The button for the chat in view, when that changed: this reply began or ended,
        or another chat (writing or not) came into view meanwhile."""
        writing = self.page.chat.writing(self.user, self.view.conv)
        if writing == self.reads_stop:
            return skip_output()
        self.reads_stop = writing
        return self.page.action(writing)

    async def opening(self, msgs: list[dict[str, Any]], conv_id: int, here: bool, edit: int | None) -> tuple[Any, ...]:
        """The first rows, with the list and the title, for the title a first message gives
        its chat; a stored edit is done."""
        chat, user, skip = self.page.chat, self.user, gr.skip()
        found = await asyncio.to_thread(chat.find, user, self.query)
        title_now = (await asyncio.to_thread(chat.conversation, user, conv_id)).title if here else skip
        if here:
            self.view.title = title_now
        ended = skip
        if edit is not None and self.view.editing == self.editing:  # stored: the edit is done
            self.view.editing, ended = None, gr.Row(visible=False)
        return (
            msgs if here else skip,
            "" if here and not self.again else skip,  # elsewhere the box holds that chat's draft
            self.page.listed(user, self.query, self.view.conv, found),
            title_now if here else skip,
            self.button(),
            conv_id if here and self.made else skip,
            ended,
        )

    def watch(self, conv_id: int) -> None:
        """This tab watches the reply it sent: a sync (webui/page/events/sync.py) follows it no more."""
        run = self.page.chat.live(self.user, conv_id)
        if run is not None:
            self.view.watching = (conv_id, run.started)

    async def in_view(self) -> list[dict[str, Any]] | Skip:
        """What the chat area shows of the chat in view, now that the reply's chat was left."""
        try:
            return await asyncio.to_thread(self.page.chat.messages, self.user, self.view.conv)
        except PageError:
            return skip_output()


class Sending(PageView):
    """The page's handlers that send, or stop a reply."""

    async def send_message(
        self,
        text: str | None,
        conv_id: int | None,
        system_text: str | None,
        stamp: int | None,
        query: str,
        temp: float,
        n_tokens: int | None,
        picked: str | None,
        view: View,
        request: gr.Request,
        again: bool = False,
        go_on: bool = False,
    ) -> AsyncIterator[tuple[Any, ...]]:
        """Stream a reply into the chat area while its chat is in view (outputs: `REPLYING`). A
        refusal leaves the typed text in the box and shows a notice; an empty box does nothing. A new chat (conv_id None)
        is made by this message, with the model `picked` (the picker's, as the browser sent it;
        None: the one picked in this session, else the first), and shown with it unless the
        browser moved on meanwhile.
        After "Edit" in this chat the message is a new version of the one edited; the edit
        ends once it is stored (a refusal keeps it). `again`: Regenerate, or with `go_on`, Continue."""
        skip = gr.skip()
        if not again and not (text or "").strip():
            # Enter or Send on an empty box: nothing happens (a notice each time stacked up)
            yield tuple(skip for _ in REPLYING)
            return
        try:
            user = await asyncio.to_thread(self.who, request)
            conv_id = None if conv_id is None else int(conv_id)
            if conv_id is not None:
                view.follow(conv_id, stamp)
            send = Send(self, user, view, stamp, query, again=again)
            edit = send.edit_of(conv_id)
            async for msgs in self.chat.reply(
                user,
                conv_id,
                text,
                temperature=temp,
                max_tokens=n_tokens,
                regenerate=again and not go_on,
                go_on=go_on,
                edit=edit,
                system_prompt=system_text or "",
                started=send.started,
                model=picked or view.model,
            ):
                conv_id = send.made[0] if send.made else conv_id
                assert conv_id is not None  # a new chat's id came (`started`) before its first rows
                here = view.conv == conv_id
                if not send.opened:
                    send.watch(conv_id)
                    yield await send.opening(msgs, conv_id, here, edit)
                    send.visible, send.opened = here, True
                elif here:
                    send.visible = True
                    yield msgs, skip, skip, skip, send.button(), skip, skip
                elif send.visible:  # its chat was left: make sure the chat area shows the one in view
                    send.visible = False
                    yield await send.in_view(), skip, skip, skip, send.button(), skip, skip
            if send.opened:  # ended: the chat in view reads Send again, unless it writes too
                yield skip, skip, skip, skip, send.button(), skip, skip
        except PageError as e:
            notice(e)
            yield skip, skip, skip, skip, skip, skip, skip  # refused before it began, or after its last yield

    async def respond_again(
        self,
        conv_id: int | None,
        stamp: int | None,
        query: str,
        temp: float,
        n_tokens: int | None,
        view: View,
        request: gr.Request,
    ) -> AsyncIterator[tuple[Any, ...]]:
        async for out in self.send_message(
            None, conv_id, "", stamp, query, temp, n_tokens, None, view, request, again=True
        ):
            yield out

    async def continue_answer(
        self,
        conv_id: int | None,
        stamp: int | None,
        query: str,
        temp: float,
        n_tokens: int | None,
        view: View,
        request: gr.Request,
    ) -> AsyncIterator[tuple[Any, ...]]:
        """Continue: the last answer goes on from where it was cut, as one message."""
        async for out in self.send_message(
            None, conv_id, "", stamp, query, temp, n_tokens, None, view, request, again=True, go_on=True
        ):
            yield out

    async def send_pressed(
        self,
        label: str,
        text: str | None,
        conv_id: int | None,
        system_text: str | None,
        stamp: int | None,
        query: str,
        temp: float,
        n_tokens: int | None,
        picked: str | None,
        view: View,
        request: gr.Request,
    ) -> AsyncIterator[tuple[Any, ...]]:
        """The button read Send when pressed: send (Stop is `stop_pressed`, outside the queue)."""
        if label == STOP:
            yield tuple(gr.skip() for _ in REPLYING)
            return
        async for out in self.send_message(
            text, conv_id, system_text, stamp, query, temp, n_tokens, picked, view, request
        ):
            yield out

    @notices(1)
    def stop_pressed(self, label: str, conv_id: int | None, request: gr.Request) -> gr.Button | Skip:
        """The button read Stop when pressed: cancel the chat's reply in the engine (what it wrote
        stays; its own event turns the button back to Send). Not queued behind the replies."""
        if label != STOP:
            return skip_output()
        if conv_id is None or not self.chat.stop(self.who(request), int(conv_id)):
            return self.action(False)  # it ended meanwhile
        return skip_output()

    async def follow_reply(
        self, conv_id: int | None, stamp: int | None, label: str, view: View, request: gr.Request
    ) -> AsyncIterator[tuple[Any, ...]]:
        """A chat came into view (the page loaded, a chat was picked), or a sync found a reply
        begun in the chat in view (webui/page/events/sync.py), while a reply of its user's is being
        written there, sent from this tab or another: it streams on here to its end,
        when the button reads Send again (outputs: `FOLLOWING`); Stop, pressed here, stops it.
        Another user's chat shows nothing of it. A reply that ended before it was found
        (`label`: the button read Stop for it) is shown as stored."""
        skip = gr.skip()
        yield skip, skip  # first: an event that yields nothing would empty its outputs
        try:
            user = await asyncio.to_thread(self.who, request)
        except PageError:
            return
        conv_id, epoch = None if conv_id is None else int(conv_id), int(stamp or 0)
        in_view: Callable[[], bool] = lambda: view.conv == conv_id and view.epoch == epoch  # noqa: E731
        run = self.chat.live(user, conv_id)
        if run is None:
            if label == STOP and in_view():  # it ended between the chat's rows and now
                yield await Send(self, user, view, epoch, "", again=True).in_view(), self.action(False)
            return
        assert conv_id is not None  # a new chat has no reply to follow: `live` found none
        view.watching = (conv_id, run.started)  # a sync need not follow it again
        reads_stop, why = None, None
        try:
            async for rows in run.watch():
                if not in_view():  # another chat (or this one again, followed anew) is in view
                    return
                yield rows, skip if reads_stop else self.action(True)
                reads_stop = True
        except PageError as e:
            why = e
        if in_view():
            if why is not None and reads_stop:  # a reply that failed midway, as its sender sees it
                notice(why)
            yield skip, self.action(self.chat.writing(user, conv_id))

    # Scripted clients of the page's queue (loadtests/page_user.py, tests) speak an older, shorter
    # form: `new_tab` makes a chat with a system prompt (its id is the value of the first output),
    # `respond` sends in a chat by id (None: a new chat). No browser triggers these two.
    @notices(len(SHOWN))
    def new_tab(self, system_text: str | None, view: View, request: gr.Request) -> tuple[Any, ...]:
        user = self.who(request)
        # sessions of one user each get theirs; with the model picked in this one, if any
        conv = self.chat.new_chat(user, system_text or "", reuse=False, model=view.model)
        self.chat.show(user, conv.id)
        current_id, chats, *rest = self.shown(user, conv.id, "", view, request)
        return (chats, current_id, *rest)

    async def respond(
        self, text: str | None, conv_id: int | None, temp: float, n_tokens: int | None, view: View, request: gr.Request
    ) -> AsyncIterator[tuple[Any, ...]]:
        async for out in self.send_message(text, conv_id, "", view.epoch, "", temp, n_tokens, None, view, request):
            yield out
