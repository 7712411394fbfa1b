"""What the chat page does, without the page: `ChatPage`, the chats and replies of every user.

`ChatPage` holds the store, the served models' engines and the metrics, and every method
takes the signed-in user, so the page (webui/page/ui/layout.py) is only layout and wiring, and
these can be tested without a browser. It is made of three parts, a chain over the state they
share (webui/page/logic/state.py): the chats
(webui/page/logic/chats.py: who is asking, the sidebar's list, opening, renaming, deleting, sharing
and exporting a chat, the branch in view and its other versions), the replies
(webui/page/logic/replies.py: a message sent, its reply streamed, stop, and its end stored once),
and the models (webui/page/logic/model_pick.py: which model each chat chats with, and its engine). What the chat area shows is
webui/page/logic/rows.py's; refusals (queue full, prompt too long, engine down, bad input) raise
`PageError` with a sentence meant for the person at the page (webui/page/logic/errors.py).
Everything shown comes from SQLite.

Threads: `reply` runs on the event loop and sends reads and writes to worker threads; the
other methods are synchronous and run where the page calls them (Gradio's worker threads).
No MLX here, no Gradio either.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from radixchat.core.engine.models import as_engines
from radixchat.core.store import Store
from radixchat.webui.page.logic.chats import LOCAL_USER, Chats
from radixchat.webui.page.logic.errors import PageError
from radixchat.webui.page.logic.live import LiveReply
from radixchat.webui.page.logic.replies import title_from
from radixchat.webui.page.logic.rows import chat_rows, row, visible_turns

if TYPE_CHECKING:
    from radixchat.core.seam.protocol import EngineClient, Engines
    from radixchat.webui.api.metrics import Metrics
    from radixchat.webui.live_requests import LiveRequests

# where the page's tests and handlers have always found them
__all__ = ["LOCAL_USER", "ChatPage", "PageError", "chat_rows", "row", "title_from", "visible_turns"]


class ChatPage(Chats):
    """The page's logic for every user at once, over the served models, one store and metrics."""

    def __init__(
        self,
        engine: EngineClient | Engines,
        store: Store,
        metrics: Metrics | None = None,
        default_max_tokens: int = 256,
        signed_in: bool = True,
        live: LiveRequests | None = None,
    ):
        # a reply goes to its chat's model (ModelPick); a delete is forgotten by every model
        self.engines = as_engines(engine)
        self.engine, self.store, self.metrics = self.engines.default, store, metrics  # engine: the first model's
        self.signed_in = signed_in  # False with --no-auth: everyone is the one local user
        self.live_requests = live  # replies stopped when their user is disabled or removed
        self.default_max_tokens = default_max_tokens
        self.running: dict[int, LiveReply] = {}  # conversation id -> its reply being written
        self._claiming = threading.Lock()  # a new chat's conversation is picked and taken at once
        # the page's writes: a write handed here finishes even if the page (or its event
        # loop) is gone by then, and a RequestEnd can hand one over from the engine's output
        # thread
        self._writes = ThreadPoolExecutor(max_workers=2, thread_name_prefix="radixchat-page-write")
