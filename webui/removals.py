"""Removed users' prefix-cache entries, forgotten by the running server's engine.

`radixchat users remove` runs in another process than the server, on the same SQLite file.
The store notes each removed user's cache key as it removes them (`removed_users`, core/
store/accounts.py), and `RemovalWatch`, a thread of the server, reads what is new there at
start-up and then every `every_s` seconds, and asks every model's engine to `forget` that
owner (core.seam.protocol's Engines): their namespace leaves the prefix cache, in memory and on disk, and
nothing of theirs is cached again. A new user never shares a removed one's namespace anyway
(it is named by a random key, never by the reusable id); forgetting is about the removed
user's text not outliving them. Users removed while no server ran are covered twice: the
first read forgets them, and the disk tier adopts at start-up only the files of the store's
users (webui/cli/main.py gives it the set).

Left to others: the removal itself (core.store), the cache (the engine), signing out the
removed user's page sessions (webui/auth/gate.py). Runs its own thread, with its own SQLite
connection; `stop` from whoever started it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixchat.core.seam.requests import owner_of
from radixchat.webui.store_poller import StorePoller

if TYPE_CHECKING:
    from radixchat.core.seam.protocol import Engines
    from radixchat.core.store import Store


class RemovalWatch(StorePoller):
    WHAT = "removed users"

    def __init__(self, store: Store, engine: Engines, every_s: float = 2.0):
        super().__init__(every_s, "radixchat-removals")
        self.store, self.engine = store, engine
        self.seen = 0  # the last removal read (a row id of `removed_users`)

    def poll(self) -> int:
        """Forget the users removed since the last poll; how many there were."""
        rows = self.store.removed_cache_keys(self.seen)
        for row_id, cache_key in rows:
            self.engine.forget(owner_of(cache_key))
            self.seen = row_id
        return len(rows)

    def start(self) -> RemovalWatch:
        self._thread.start()
        return self
