"""How many requests each user has waiting or running: what `--max-user-requests` limits.

One `OwnerCounts` per server: an engine serving alone has its own; the engines of several
models (core.engine.models) share one, so a user's requests count on every model together
and ten models do not give anyone ten times the limit. A request counts from the moment it
arrives (core.engine.intake) until it ends (the engine thread gives it back).
Any thread; the lock is its own, always taken inside an engine's `_lock` when both are.
"""

from __future__ import annotations

import threading
from collections import Counter

from radixchat.core.seam.requests import UserLimit


class OwnerCounts:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._n: Counter[str] = Counter()

    def take(self, owner: str, limit: int) -> None:
        """Count one more request of `owner`; RequestError 429 `user_limit` at `limit`."""
        with self._lock:
            mine = self._n[owner]
            if mine >= limit:
                raise UserLimit(mine)
            self._n[owner] = mine + 1

    def give(self, owner: str) -> None:
        with self._lock:
            self._n[owner] -= 1
            if self._n[owner] <= 0:
                del self._n[owner]

    def __getitem__(self, owner: str) -> int:
        with self._lock:
            return self._n[owner]
