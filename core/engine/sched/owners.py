"""How many requests each user has waiting or running: what `--max-user-requests` limits.

One `OwnerCounts` per server: an engine serving alone has its own; the engines of several
models (core.engine.models) share one, so a user's requests count on every model together
and ten models do not give anyone ten times the limit. A request counts from the moment it
arrives (core.engine.intake) until it ends (the engine thread gives it back). It also says
whether anyone else is at work (`others_at_work`), for the preparation pool's pacing of a
user's heavy jobs (core.engine.prepare: grammar compiles, long texts), counting a user between
two turns as at work for `LINGER_S`.
Any thread; the lock is its own, always taken inside an engine's `_lock` or the preparation
pool's when both are.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from radixchat.core.seam.requests import UserLimit

# a user whose last request ended this long ago still counts as at work: they are reading the
# reply or typing the next message, and what is held back for them should not be let go between
# two turns only to be taken back at the next (core.engine.sched.mask_share too)
LINGER_S = 2.0


class OwnerCounts:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._n: Counter[str] = Counter()
        self._ended: dict[str, float] = {}  # owner -> when their last request ended (monotonic s)

    def take(self, owner: str, limit: int) -> None:
        """Count one more request of `owner`; RequestError 429 `user_limit` at `limit`."""
        with self._lock:
            mine = self._n[owner]
            if mine >= limit:
                raise UserLimit(mine)
            self._n[owner] = mine + 1
            self._ended.pop(owner, None)

    def give(self, owner: str) -> None:
        with self._lock:
            self._n[owner] -= 1
            if self._n[owner] <= 0:
                del self._n[owner]
                self._ended[owner] = time.monotonic()

    def others_at_work(self, owner: object, linger_s: float = LINGER_S) -> bool:
        """Has anyone but `owner` a request in flight, or had one less than `linger_s` ago?"""
        now = time.monotonic()
        with self._lock:
            for o in [o for o, t in self._ended.items() if now - t >= linger_s]:
                del self._ended[o]
            return any(o != owner for o in self._n) or any(o != owner for o in self._ended)

    def __getitem__(self, owner: str) -> int:
        with self._lock:
            return self._n[owner]
