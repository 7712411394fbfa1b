"""Sign-in that can't be brute-forced, used to flood the machine, or aimed at someone.

`SignInGuard.sign_in` checks a user name and password for the page. Failures are counted per
user name and per client address; after `free_failures` of either, each further failure
doubles a lockout (1 s, 2 s, 4 s ... up to `max_lockout_s`) during which sign-ins for that
name or from that address are refused with 429 before any password is hashed, the right
password included, so guessing stays slow whoever guesses. A count forgets one failure every
`forgive_s` without one, so failing a name now and then (one every five minutes) keeps its count
low and locks it for a second at most, where a count that never fell kept it locked for good;
guessing at full speed is held near one try per `forgive_s` (two minutes).

Those lockouts alone would let anyone keep a user out by failing their password now and then
from addresses of their own. So a browser that signed in as a user before (it holds a valid
device cookie for that name, webui/auth/device_cookie.py) is trusted for that name: its attempts
are counted and locked out per that cookie only, never by the name's or the address's
failures, and its failures lock out nobody else (OWASP's device cookies). Browsers without one
keep the name and address lockouts.

Hashing (scrypt, ~0.4 s of one core) runs on `hash_workers` threads behind a queue that is
fair by client address, trusted browsers first (webui/auth/signin_queue.py), so a crowd of
sign-ins queues there, not on the engine's cores, and costs a sign-in from elsewhere about a
hash per address in the crowd, not a hash per attempt. The lockout is asked again right
before each hash, so a burst sent at once gets `free_failures` hashes, not one each.
Failures are logged with name and address.

Gradio calls the auth function with the name and password only; what else a sign-in needs
(the address, the cookies) and what it leaves for the answer (a new device cookie) travel in
an `Attempt` that webui/auth/signin_door.py, the ASGI middleware in front of /login, puts in a
context variable. Checking the password is core.store's job; this module decides when to ask
and what a failure counts against. Runs on the event loop; hashing in the line's threads.
"""

from __future__ import annotations

import contextvars
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

from radixchat.core.store import MAX_NAME_CHARS, MAX_PASSWORD_CHARS, AccountDisabled, AuthFailed
from radixchat.webui.auth.device_cookie import DeviceCookies
from radixchat.webui.auth.signin_queue import HashingLine, QueueFull, SignInRefused, address_lane

log = logging.getLogger("radixchat.signin")

MAX_TRACKED = 10_000  # names, addresses and devices remembered at once; the oldest are forgotten first

_Key = tuple[str, str]  # what a failure counts against: ("name" | "addr" | "device", which)

__all__ = ["Attempt", "QueueFull", "SignInGuard", "SignInRefused", "TooManyFailures"]


class TooManyFailures(SignInRefused):
    def __init__(self, retry_after_s: float):
        super().__init__(f"too many failed sign-ins: try again in {math.ceil(retry_after_s)} s", retry_after_s)


@dataclass
class Attempt:
    """One POST /login as the door saw it, and what the guard leaves for its answer."""

    addr: str
    cookies: dict[str, str] = field(default_factory=dict)
    secure: bool = False  # over HTTPS: the device cookie gets Secure
    set_cookie: str | None = None  # a new device cookie, once the password was right


_attempt: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar("radixchat_signin", default=None)


def begin(attempt: Attempt) -> None:
    """Called by the door for this request's task, before Gradio's /login runs."""
    _attempt.set(attempt)


@dataclass
class _Failures:
    count: int = 0
    locked_until: float = 0.0
    since: float = 0.0  # when the count last lost a failure to time (or began)


class SignInGuard:
    def __init__(
        self,
        verify: Callable[[str, str], object],
        *,
        free_failures: int = 5,
        max_lockout_s: float = 300.0,
        forgive_s: float = 120.0,
        hash_workers: int = 1,
        devices: DeviceCookies | None = None,
        queue_per_address: int = 64,
        queue_total: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._verify = verify  # (name, password) -> user, or raises AuthFailed
        self.devices = devices  # None: no browser is ever trusted
        self.free_failures = free_failures
        self.max_lockout_s = max_lockout_s
        self.forgive_s = forgive_s
        self._clock = clock
        self._failures: OrderedDict[_Key, _Failures] = OrderedDict()
        self._line = HashingLine(hash_workers, per_lane=queue_per_address, total=queue_total)
        self._lock = threading.Lock()  # the failure table: the event loop and the hashing threads both use it
        self.refused = 0  # sign-ins answered 429 without hashing
        self.failed = 0

    async def sign_in(
        self, name: str, password: str, addr: str | None = None, cookies: Mapping[str, str] | None = None
    ) -> bool:
        """True for the right password; False for a wrong one; TooManyFailures while the
        name or the address is locked out, or a trusted browser's own cookie is (nothing is
        hashed then); QueueFull when its lane of the hashing queue has no room."""
        attempt = _attempt.get()
        addr = addr or (attempt.addr if attempt else "?")
        if cookies is None:
            cookies = attempt.cookies if attempt else {}
        device = self.devices.trusted(name, cookies) if self.devices else None
        if device:  # this browser's failures only; served in its user's lane, ahead at equal turns
            keys, lane = [("device", device)], ("user", name.lower())
        else:
            keys, lane = [("name", name.casefold()), ("addr", addr)], ("addr", address_lane(addr))
        self._refuse_if_locked(keys)  # cheap, before queueing for a hash
        # what the store would make of them anyway (too long: refused), held in the queue small
        check = partial(self._check, keys, name[: MAX_NAME_CHARS + 1], password[: MAX_PASSWORD_CHARS + 1])
        ok = await self._line.run(lane, check, trusted=device is not None)
        if not ok:
            log.warning("failed sign-in for %r from %s%s", name[:64], addr, " (a trusted browser)" if device else "")
        elif attempt is not None and self.devices is not None:
            attempt.set_cookie = self.devices.issue(name, attempt.secure)
        return ok

    def _check(self, keys: list[_Key], name: str, password: str) -> bool:
        """In a hashing thread: sign-ins sent at once queue here, so the lockout is asked
        again right before each hash; otherwise a burst would all be hashed before the
        first failure counted."""
        self._refuse_if_locked(keys)
        try:
            self._verify(name, password)
        except AccountDisabled:
            raise  # the right password: no failure to count; the page says why (webui/server.py)
        except AuthFailed:
            with self._lock:
                self.failed += 1
                for k in keys:
                    self._fail(k)
            return False
        with self._lock:
            # a trusted browser's success clears its own count only: the name's stays, so
            # a guesser's count is not wiped by the user signing in elsewhere
            for k in keys:
                self._failures.pop(k, None)
        return True

    def _refuse_if_locked(self, keys: list[_Key]) -> None:
        wait = self._lockout(keys)
        if wait > 0:
            raise TooManyFailures(wait)

    def address_lockout(self, addr: str) -> float:
        """Seconds left of `addr`'s lockout (0: none). Counts as a refused sign-in when > 0."""
        return self._lockout([("addr", addr)])

    def _lockout(self, keys: list[_Key]) -> float:
        """The longest lockout among `keys`, counted as a refusal when there is one."""
        with self._lock:
            wait = max(self._locked_for(k) for k in keys)
            if wait > 0:
                self.refused += 1
            return wait

    @property
    def queue_refused(self) -> int:
        """Sign-ins refused because the hashing queue had no room for them."""
        return self._line.refused

    def close(self) -> None:
        self._line.close()

    def _locked_for(self, key: _Key) -> float:
        f = self._failures.get(key)
        return max(0.0, f.locked_until - self._clock()) if f else 0.0

    def _fail(self, key: _Key) -> None:
        now = self._clock()
        f = self._failures.pop(key, None) or _Failures(since=now)
        self._failures[key] = f  # most recent last: the oldest go first when over MAX_TRACKED
        forgiven = int((now - f.since) // self.forgive_s)
        if forgiven:
            f.count = max(0, f.count - forgiven)
            f.since = now if f.count == 0 else f.since + forgiven * self.forgive_s
        f.count += 1
        if f.count >= self.free_failures:
            f.locked_until = now + min(self.max_lockout_s, 2.0 ** (f.count - self.free_failures))
        while len(self._failures) > MAX_TRACKED:
            self._failures.popitem(last=False)
