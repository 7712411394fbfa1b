"""Device cookies: a browser that signed in as a user before is known again at that user's sign-in.

OWASP's "device cookie" answer to lockouts aimed at someone: a successful page sign-in gives
the browser a cookie bound to that user name, and a sign-in that shows a valid one for the
name it names is counted and locked out only per that cookie (webui/auth/signin.py), so nobody
else's failures, from whatever address, keep that browser out.

A cookie is `<nonce>.<mac>`: 128 random bits and an HMAC-SHA256 of the name and the nonce
keyed with the user's session key (core.store's `session_key`: 128 random bits that never
leave the server, renewed by a password change, another for a new user of the same name). So
nobody can make one without the key, and every cookie of a user stops counting when their
password changes or they are removed, with no table of cookies to keep. One cookie per user
name (its cookie name is a hash of the user name), so a browser shared by two users keeps
both; HttpOnly, SameSite=Strict, Secure over HTTPS, a year long.

Owns the cookie's format and checking; what a trusted sign-in changes is webui/auth/signin.py's,
setting the cookie on the answer webui/auth/signin_door.py's. Runs on the event loop (one indexed
read of the store per cookie checked or made).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable, Mapping

from radixchat.core.store import StoreError, is_valid_name

PREFIX = "radixchat-device-"
MAX_AGE_S = 365 * 24 * 3600
_LABEL = b"radixchat device cookie\0"
_VALUE = re.compile(r"([A-Za-z0-9_-]{22})\.([A-Za-z0-9_-]{22})")  # what `issue` makes, nothing else


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


class DeviceCookies:
    """Makes and checks device cookies; `session_key(name)` is the store's (None: no such user)."""

    def __init__(self, session_key: Callable[[str], str | None], max_age_s: int = MAX_AGE_S):
        self._session_key = session_key
        self.max_age_s = max_age_s

    @staticmethod
    def cookie_name(name: str) -> str:
        # names match case-insensitively (the store's NOCASE, ASCII names), so one cookie
        # serves "Alice" and "alice"; hashed so the cookie jar does not list who signed in
        digest = hashlib.sha256(_LABEL + name.lower().encode("ascii", "replace")).hexdigest()
        return PREFIX + digest[:16]

    @staticmethod
    def any_in(cookies: Mapping[str, str]) -> bool:
        return any(k.startswith(PREFIX) for k in cookies)

    def trusted(self, name: str, cookies: Mapping[str, str]) -> str | None:
        """The device id (the nonce) when `cookies` hold a valid device cookie for `name`
        under the user's current session key; None otherwise."""
        if not is_valid_name(name):
            return None
        value = _VALUE.fullmatch(cookies.get(self.cookie_name(name), ""))
        if value is None:
            return None
        nonce, mac = value.groups()
        key = self._key(name)
        if key is None or not hmac.compare_digest(mac, self._mac(key, name, nonce)):
            return None
        return nonce

    def issue(self, name: str, secure: bool) -> str | None:
        """A Set-Cookie value with a new device cookie for `name` (None: no such user now)."""
        key = self._key(name) if is_valid_name(name) else None
        if key is None:
            return None
        nonce = _b64(secrets.token_bytes(16))
        value = f"{nonce}.{self._mac(key, name, nonce)}"
        flags = f"Path=/; Max-Age={self.max_age_s}; HttpOnly; SameSite=Strict" + ("; Secure" if secure else "")
        return f"{self.cookie_name(name)}={value}; {flags}"

    def _key(self, name: str) -> str | None:
        try:
            return self._session_key(name)
        except StoreError:  # the store cannot answer now: not trusted, this attempt only
            return None

    @staticmethod
    def _mac(key: str, name: str, nonce: str) -> str:
        message = _LABEL + name.lower().encode("ascii") + b"\0" + nonce.encode("ascii")
        return _b64(hmac.new(key.encode(), message, hashlib.sha256).digest()[:16])
