"""The requests under way, by user and API key, stopped when their user or key is cut off.

Disabling a user (the Admin tab), removing one (`radixchat users remove`, another process on
the same SQLite file) and revoking a key refuse what comes next at once; without this, what
was already running went on to its end (a page reply of 40 s, a stream of a minute).
`LiveRequests.track` notes each accepted request's handle under its user and, for the API,
its key's hash; the handle leaves when it ends. A thread (started with the first request
tracked) reads the store every `every_s` seconds while anything is tracked (one query for the users, one for the keys) and cancels
what belongs to a user or key that may no longer work, with a reason the API's answer
carries (webui/api/generation.py). The engine ends them as cancelled at its next step, the
text so far kept, as Stop does.

Left to others: the refusals of what comes next (core.store, webui/api/deps.py, the gate),
the cancel itself (the engine). `track` runs on the event loop, the end callbacks on the
engine's output thread, the poll on this module's thread; a lock keeps the table.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from radixchat.webui.store_poller import StorePoller

if TYPE_CHECKING:
    from radixchat.core.seam.handle import RequestHandle
    from radixchat.core.store import Store

log = logging.getLogger("radixchat.live")

USER_CUT_OFF = "this user was disabled or removed while the request ran"
KEY_CUT_OFF = "this API key was revoked (or its user disabled) while the request ran"


class LiveRequests(StorePoller):
    WHAT = "running requests' users"

    def __init__(self, store: Store, every_s: float = 0.5):
        super().__init__(every_s, "radixchat-live-requests")
        self.store = store
        self._lock = threading.Lock()
        self._live: dict[str, tuple[RequestHandle, int, str | None]] = {}  # handle id -> (handle, user, key hash)

    def track(self, handle: RequestHandle, user: int, key_hash: str | None = None) -> None:
        with self._lock:
            self._live[handle.id] = (handle, user, key_hash)
            if not self._thread.is_alive() and not self._stop.is_set():
                self._thread.start()  # with the first request held: an app never served starts none
        handle.add_done_callback(lambda _final: self._ended(handle.id))  # at once if it already ended

    def _ended(self, rid: str) -> None:
        with self._lock:
            self._live.pop(rid, None)

    def poll(self) -> int:
        """Cancel what a cut-off user or key has running; how many were cancelled."""
        with self._lock:
            live = list(self._live.values())
        if not live:
            return 0
        users, keys = self.store.cut_off({u for _, u, _ in live}, {k for _, _, k in live if k})
        n = 0
        for handle, user, key in live:
            reason = USER_CUT_OFF if user in users else KEY_CUT_OFF if key in keys else None
            if reason is not None:
                handle.cancel(reason)
                n += 1
        if n:
            log.info("cancelled %d running request(s) of cut-off users or keys", n)
        return n
