"""The door of Gradio's /login and /logout: no sign-in or sign-out from another site.

`SignInDoor` is an ASGI middleware in front of the app. For Gradio's /login (and /login/):
  - it refuses (403) a request another site made a browser send, so a page elsewhere can
    neither sign a visitor in as someone else (login CSRF: bob would chat, and his chats be
    kept, under mallory's account) nor, at /logout, sign them out;
  - it answers a sign-in from an address in a lockout at once (429) before the form is
    parsed and the page's stack runs, so a guesser that ignores Retry-After costs the others
    little; not when the request carries a device cookie, which webui/auth/signin.py checks and
    may trust whatever the address did;
  - it hands the guard an `Attempt` (the client's address, the cookies) and puts the device
    cookie the guard made for a right password on the answer.

Which request came from another site: the browser's own `Sec-Fetch-Site` when it sends one
(every current browser does over HTTPS and to localhost; page scripts cannot set it) decides
alone: "same-origin" and "none" (typed, a bookmark) pass, anything else is refused. Without
it, `Origin` or, lacking that, `Referer` must name this server, as the `Host` the request
came with names it (a reverse proxy must pass Host through, or send Sec-Fetch-Site's verdict
over HTTPS). A request with none of the three is not a browser's cross-site one for
POST /login (browsers send Origin with every POST, "null" when the page hides itself), so it
passes: that is how curl, Gradio's Python client and the tests sign in. For /logout it is
refused: a link elsewhere that hides its Referer, opened over plain HTTP, sends none of them.

Lockouts and trust are webui/auth/signin.py's, the cookie's format webui/auth/device_cookie.py's. Runs
on the event loop.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixchat.webui.auth.gate import answer, header, request_cookies, route_path
from radixchat.webui.auth.signin import Attempt, SignInGuard, TooManyFailures, begin

log = logging.getLogger("radixchat.signin")

LOGIN = ("/login", "/login/")  # Gradio's own routes
LOGOUT = ("/logout", "/logout/")
_DEFAULT_PORT = {"http": ":80", "https": ":443"}


class SignInDoor:
    """ASGI middleware in front of /login and /logout (see the module's docstring)."""

    def __init__(self, app: ASGIApp, guard: SignInGuard | None = None):
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = route_path(scope)
        if path in LOGIN or path in LOGOUT:
            why = cross_site(scope, bare_allowed=path in LOGIN)
            if why is not None:
                what = "sign-in" if path in LOGIN else "sign-out"
                log.warning("refused a %s from another site, from %s (%s)", what, _addr(scope), why[:120])
                detail = f"Refused: this {what} did not come from this server's page ({why}). Use the page itself."
                return await answer(send, 403, detail, scope)
        if path in LOGIN and scope["method"] == "POST" and self.guard is not None:
            return await self._login(scope, receive, send)
        await self.app(scope, receive, send)

    async def _login(self, scope: Scope, receive: Receive, send: Send) -> None:
        guard = self.guard
        assert guard is not None  # `__call__` comes here only with a guard
        addr = _addr(scope)
        cookies = request_cookies(scope)
        devices = guard.devices
        # with a device cookie the guard decides (a trusted browser is not locked out by
        # its address); without one, an address in a lockout is answered before the form is read
        if devices is None or not devices.any_in(cookies):
            wait = guard.address_lockout(addr)
            if wait > 0:
                return await answer(send, 429, str(TooManyFailures(wait)), scope, retry_after=wait)
        attempt = Attempt(addr, cookies, secure=scope.get("scheme") == "https")
        begin(attempt)

        async def send_with_cookie(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 200 and attempt.set_cookie:
                cookie = (b"set-cookie", attempt.set_cookie.encode("latin-1"))
                message = {**message, "headers": [*message.get("headers", []), cookie]}
            await send(message)

        await self.app(scope, receive, send_with_cookie)


def cross_site(scope: Scope, bare_allowed: bool) -> str | None:
    """Why this request is to be taken for one another site made, or None when it is not
    (see the module's docstring for the rules)."""
    fetched = header(scope, b"sec-fetch-site")
    if fetched is not None:
        site = fetched.decode("latin-1").strip().lower()
        return None if site in ("same-origin", "none") else f"Sec-Fetch-Site: {site}"
    host = header(scope, b"host")
    for name in (b"origin", b"referer"):
        raw = header(scope, name)
        if raw is not None:
            value = raw.decode("latin-1")
            if host is not None and same_origin(value, host.decode("latin-1")):
                return None
            return f"{name.decode().title()}: {value}"
    return None if bare_allowed else "no Sec-Fetch-Site, Origin or Referer"


def same_origin(url: str, host: str) -> bool:
    """Does `url` (an Origin or a Referer) name the server that `host` (the Host header)
    names? Scheme aside: behind a proxy that ends TLS the request itself is plain HTTP."""
    try:
        parts = urlsplit(url.strip())
        hostname = parts.hostname  # also checks the port is a number
    except ValueError:
        return False
    if parts.scheme not in _DEFAULT_PORT or not hostname:
        return False  # "null" (a page that hides where it is), file:, about: ...
    theirs = parts.netloc.rpartition("@")[2].lower()
    ours = host.strip().lower()
    default = _DEFAULT_PORT[parts.scheme]
    return theirs.removesuffix(default) == ours.removesuffix(default)


def _addr(scope: Scope) -> str:
    client = scope.get("client")
    return client[0] if client else "?"
