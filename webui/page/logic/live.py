"""The page's replies while they are written: each one the server's, not a tab's.

A `LiveReply` is one reply being written in a chat: whose it is, its engine handle, the text
so far, what the chat area shows of it now, and how it ended. `start` runs its writing (the
whole of it: the request, the stream, the stored end; ChatPage's `_write`,
webui/page/logic/replies.py) as a task of the server's event loop that no tab owns. The tab that
sent the reply, and any tab that opens its chat meanwhile (a reload, a second tab, another
device of the same user), only `watch` it: a tab that goes away ends its watching, never the
reply, which runs to its end or to Stop and is stored then, watched or not. A watcher gets
the latest rows, never a backlog, and the reply's error (a refusal, a failed reply) at its
end. Which chat's reply a user may watch or stop is ChatPage's (`running`, owner-checked in
replies.py's `live` and `stop`); this module knows nothing of users, the store or the engine.

Threads: the writing and the watching run on the server's event loop; the page's worker
threads only read `user_id`, `live` and `text` and set `stopping` (and cancel the handle,
which is thread-safe). No MLX, no Gradio.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixchat.core.seam.handle import RequestHandle

# the writing tasks: the event loop keeps only weak references to its tasks
_writing: set[asyncio.Task[None]] = set()


def start(writing: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    """Run a reply's writing on the running event loop, owned by no caller: cancelling the
    caller (a tab gone) leaves it running."""
    task = asyncio.get_running_loop().create_task(writing)
    _writing.add(task)
    task.add_done_callback(_writing.discard)
    return task


@dataclass(eq=False)
class LiveReply:
    """A reply being written in a chat: who asked, its engine handle, the text so far, what the
    chat area shows (`rows`), and its end. Registered in its chat before anything is awaited,
    so a chat writes one reply at a time."""

    user_id: int
    handle: RequestHandle | None = None  # set once the engine took the request
    live: bool = False  # the user's message is stored: the chat shows this reply
    stopping: bool = False  # Stop was pressed (maybe before the engine had the request)
    text: str = ""
    started: float = field(default_factory=time.time)
    rows: list[dict[str, Any]] | None = None  # what the chat area shows of it now; None: nothing yet
    done: bool = False
    error: BaseException | None = None  # what a watcher raises once it has the last rows
    _changed: asyncio.Event | None = field(default=None, repr=False)

    def show(self, rows: list[dict[str, Any]]) -> None:
        """New rows for every watcher."""
        self.rows = rows
        self._wake()

    def end(self, rows: list[dict[str, Any]] | None = None, error: BaseException | None = None) -> None:
        """The reply ended (stored, or refused): its last rows, if any, and its error, if any.
        Only the first call counts."""
        if self.done:
            return
        if rows is not None:
            self.rows = rows
        self.done, self.error = True, error
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    async def watch(self) -> AsyncIterator[list[dict[str, Any]]]:
        """The rows as they change (the latest each time; the same rows never twice), until the
        reply ends; then its error, if it has one. Leaving changes nothing of the reply."""
        seen = None
        while True:
            if self.rows is not None and self.rows is not seen:
                seen = self.rows
                yield seen
                continue  # look again: it may have changed while the watcher was away
            if self.done:
                break
            if self._changed is None:
                self._changed = asyncio.Event()
            await self._changed.wait()
        if self.error is not None:
            raise self.error
