"""Sign-in that can't be brute-forced or used to flood the machine.

`SignInGuard.sign_in` checks a user name and password for the page. Failures are counted per
user name and per client address; after `free_failures` of either, each further failure
doubles a lockout (1 s, 2 s, 4 s ... up to `max_lockout_s`) during which sign-ins for that
name or from that address are refused with 429 before any password is hashed, the right
password included, so guessing stays slow whoever guesses. Hashing (scrypt, ~0.4 s of one
core) runs in a pool of `hash_workers` threads, so a crowd of sign-ins queues there instead
of taking the cores the engine needs; the lockout is asked again in the pool right before
each hash, so a burst of sign-ins sent at once gets `free_failures` hashes, not one each.
Failures are logged with name and address.

The client's address comes from `ClientAddress`, a small ASGI middleware, because Gradio
calls the auth function with the name and password only. Checking the password is
core.store's job; this module decides when to ask. Runs on the event loop; hashing in its pool.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from radixchat.core.store import AuthFailed

log = logging.getLogger("radixchat.signin")

_client_addr: contextvars.ContextVar[str] = contextvars.ContextVar("radixchat_client_addr", default="?")
MAX_TRACKED = 10_000  # names and addresses remembered at once; the oldest are forgotten first


class TooManyFailures(Exception):
    def __init__(self, retry_after_s: float):
        super().__init__(f"too many failed sign-ins: try again in {math.ceil(retry_after_s)} s")
        self.retry_after_s = retry_after_s


@dataclass
class _Failures:
    count: int = 0
    locked_until: float = 0.0


class SignInGuard:
    def __init__(
        self,
        verify: Callable[[str, str], object],
        *,
        free_failures: int = 5,
        max_lockout_s: float = 300.0,
        hash_workers: int = 1,
        clock=time.monotonic,
    ):
        self._verify = verify  # (name, password) -> user, or raises AuthFailed
        self.free_failures = free_failures
        self.max_lockout_s = max_lockout_s
        self._clock = clock
        self._failures: OrderedDict[tuple[str, str], _Failures] = OrderedDict()
        self._pool = ThreadPoolExecutor(max_workers=hash_workers, thread_name_prefix="radixchat-signin")
        self._lock = threading.Lock()  # the failure table: the event loop and the pool both use it
        self.refused = 0  # sign-ins answered 429 without hashing
        self.failed = 0

    async def sign_in(self, name: str, password: str, addr: str | None = None) -> bool:
        """True for the right password; False for a wrong one; TooManyFailures while the
        name or the address is locked out (nothing is hashed then)."""
        addr = addr or _client_addr.get()
        keys = [("name", name.casefold()), ("addr", addr)]
        self._refuse_if_locked(keys)  # cheap, before queueing for the pool
        loop = asyncio.get_running_loop()
        ok = await loop.run_in_executor(self._pool, self._check, keys, name, password)
        if not ok:
            log.warning("failed sign-in for %r from %s", name[:64], addr)
        return ok

    def _check(self, keys, name: str, password: str) -> bool:
        """In the hashing pool: sign-ins sent at once queue here, so the lockout is asked
        again right before each hash; otherwise a burst would all be hashed before the
        first failure counted."""
        self._refuse_if_locked(keys)
        try:
            self._verify(name, password)
        except AuthFailed:
            with self._lock:
                self.failed += 1
                for k in keys:
                    self._fail(k)
            return False
        with self._lock:
            for k in keys:
                self._failures.pop(k, None)
        return True

    def _refuse_if_locked(self, keys) -> None:
        wait = self._lockout(keys)
        if wait > 0:
            raise TooManyFailures(wait)

    def address_lockout(self, addr: str) -> float:
        """Seconds left of `addr`'s lockout (0: none). Counts as a refused sign-in when > 0."""
        return self._lockout([("addr", addr)])

    def _lockout(self, keys) -> float:
        """The longest lockout among `keys`, counted as a refusal when there is one."""
        with self._lock:
            wait = max(self._locked_for(k) for k in keys)
            if wait > 0:
                self.refused += 1
            return wait

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _locked_for(self, key) -> float:
        f = self._failures.get(key)
        return max(0.0, f.locked_until - self._clock()) if f else 0.0

    def _fail(self, key) -> None:
        f = self._failures.pop(key, None) or _Failures()
        self._failures[key] = f  # most recent last: the oldest go first when over MAX_TRACKED
        f.count += 1
        if f.count >= self.free_failures:
            f.locked_until = self._clock() + min(self.max_lockout_s, 2.0 ** (f.count - self.free_failures))
        while len(self._failures) > MAX_TRACKED:
            self._failures.popitem(last=False)


class ClientAddress:
    """ASGI middleware: remember the client's address for the auth function of this request,
    and answer a sign-in from an address in a lockout at once, before the form is parsed and
    the page's stack runs: a guesser that ignores Retry-After then costs the others little."""

    def __init__(self, app, guard: SignInGuard | None = None, login_path: str = "/login"):
        self.app = app
        self.guard = guard
        self.login_path = login_path

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("client"):
            addr = scope["client"][0]
            _client_addr.set(addr)
            if self.guard is not None and scope["path"] == self.login_path and scope["method"] == "POST":
                wait = self.guard.address_lockout(addr)
                if wait > 0:
                    await _too_many(send, wait)
                    return
        await self.app(scope, receive, send)


async def _too_many(send, wait: float) -> None:
    body = f'{{"detail":"{TooManyFailures(wait)}"}}'.encode()
    await send(
        {
            "type": "http.response.start",
            "status": 429,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(math.ceil(wait)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
