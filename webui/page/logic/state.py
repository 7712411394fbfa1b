"""What ChatPage's parts share: the engines, the store, the metrics, the replies being
written and the page's writer threads, declared once so that each part, and the type
checker, sees the same state (as core.store's StoreBase does for the store's parts).

`ChatPage` (webui/page/logic/chat_page.py) is a chain of parts, each over the one below: this state,
the models (webui/page/logic/model_pick.py), the replies (webui/page/logic/replies.py), the chats
(webui/page/logic/chats.py). ChatPage's constructor sets every attribute declared here; the two
helpers every part uses live here too. Runs wherever the page calls it; no MLX, no Gradio.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from radixchat.core.seam.requests import owner_of
from radixchat.core.store import Branch, RequestFigures, Store, User
from radixchat.webui.page.logic.rows import visible_turns

if TYPE_CHECKING:
    from radixchat.core.seam.protocol import EngineClient, Engines
    from radixchat.webui.api.metrics import Metrics
    from radixchat.webui.live_requests import LiveRequests
    from radixchat.webui.page.logic.live import LiveReply


class PageState:
    engines: Engines  # every served model's
    engine: EngineClient  # the first model's
    store: Store
    metrics: Metrics | None
    signed_in: bool  # False with --no-auth: everyone is the one local user
    live_requests: LiveRequests | None = None  # stops a cut-off user's replies
    default_max_tokens: int
    running: dict[int, LiveReply]  # conversation id -> its reply being written
    _claiming: threading.Lock  # a new chat's conversation is picked and taken at once
    _writes: ThreadPoolExecutor  # the page's writes, which finish even if the page is gone

    def owner(self, user: User) -> str | None:
        """Whose requests these are, for the engine's cache scope and fair share (None: the
        one trusted user of --no-auth)."""
        return owner_of(user.cache_key) if self.signed_in else None

    def _turns(self, user: User, conv_id: int) -> tuple[Branch, dict[int, RequestFigures]]:
        """The branch in view and the figures of its answers."""
        branch = self.store.branch(user, conv_id)
        return branch, self.store.request_metrics(m.request for m in visible_turns(branch.messages))
