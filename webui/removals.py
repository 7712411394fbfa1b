"""Removed users' prefix-cache entries, forgotten by the running server's engine.

`radixchat users remove` runs in another process than the server, on the same SQLite file.
The store notes each removed user's cache key as it removes them (`removed_users`, core/
store/accounts.py), and `RemovalWatch`, a thread of the server, reads what is new there at
start-up and then every `every_s` seconds, and asks every model's engine to `forget` that
owner (core.engine.seam's Engines): their namespace leaves the prefix cache, in memory and on disk, and
nothing of theirs is cached again. A new user never shares a removed one's namespace anyway
(it is named by a random key, never by the reusable id); forgetting is about the removed
user's text not outliving them. Users removed while no server ran are covered twice: the
first read forgets them, and the disk tier adopts at start-up only the files of the store's
users (webui/cli.py gives it the set).

Left to others: the removal itself (core.store), the cache (the engine), signing out the
removed user's page sessions (webui/gate.py). Runs its own thread, with its own SQLite
connection; `stop` from whoever started it.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from radixchat.core.engine.requests import owner_of
from radixchat.core.store import StoreError

if TYPE_CHECKING:
    from radixchat.core.engine.seam import Engines
    from radixchat.core.store import Store

log = logging.getLogger("radixchat.removals")


class RemovalWatch:
    def __init__(self, store: Store, engine: Engines, every_s: float = 2.0):
        self.store, self.engine, self.every_s = store, engine, every_s
        self.seen = 0  # the last removal read (a row id of `removed_users`)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="radixchat-removals", daemon=True)

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

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            try:
                self.poll()
            except StoreError as e:  # a busy or closing store: the next poll tries again
                log.warning("removed users not read: %s", e)
            except Exception:
                log.exception("removed users not read")
            if self._stop.wait(self.every_s):
                return
