"""Who may reach the page's own routes: a page session answers only the sign-in that opened it.

Gradio names a browser's page session by a `session_hash` the browser makes up, and trusts
whoever names it: anyone who learnt another user's hash could read that user's reply as it
streamed (queue/data), stop it without signing in (cancel) or end the session (heartbeat).
`PageGate`, an ASGI middleware in front of the page, binds each session to the caller who
first used it (queue/join or heartbeat) and refuses every other caller that names it. It
lets through only the /gradio_api routes the page uses; uploads, file downloads, deep links,
direct API calls and the rest answer 404 before a byte of their body is read. A signed-in
browser at `/?next=/shared/<token>` (Gradio's sign-in reloads the address it was on) is sent
back to that shared link: `return_to` lets only such a path through, never another site.

The caller is the signed-in user of Gradio's own sign-in cookie, looked up in Gradio's token
table as Gradio's routes do. That table is a `SessionTokens`: each sign-in is bound to the
user's session key at that moment (core.store), and a cookie whose user has since changed
their password or been removed (a new user of the same name has another key) is signed out
at its next request, in every Gradio route and here (all but the sign-in a password was
changed from, which goes on). With --no-auth everyone is the one
local user (on loopback unless --allow-open-lan), so there is no user to tell apart;
sessions are bound instead to a per-browser cookie this module sets, so one browser still
cannot stop another's reply. A client that keeps no cookies can start a session there but
not come back to it.

What this module reads of Gradio's internals (the App's cookie id and tokens, the queue's
events) is in `GradioSide`. Which user may see which conversation stays the page's job
(webui/page/). Runs on the server's event loop only, so its tables need no lock (Gradio's
sign-out, in a worker thread, only deletes tokens: one dict operation at a time).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

from starlette.datastructures import QueryParams
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixchat.core.store import StoreError

if TYPE_CHECKING:
    from gradio.blocks import Blocks
    from gradio.routes import App

    from radixchat.core.store import Store

_T = TypeVar("_T")

API = "/gradio_api/"
HEARTBEAT = "heartbeat/"
BROWSER_COOKIE = "radixchat_browser"

JOIN, DATA, CANCEL, OPEN = "join", "data", "cancel", "open"
# The /gradio_api routes Gradio 6's browser client calls for this page, exact paths only, so
# a variant spelling (a trailing slash, a new route in a later Gradio) is refused, not let by.
# OPEN routes name no session: Gradio answers them, behind its own sign-in where it has one.
ROUTES = {
    "queue/join": JOIN,
    "queue/data": DATA,
    "cancel": CANCEL,
    "reset": OPEN,
    "reset/": OPEN,  # a no-op in Gradio 6: /cancel does the work
    "info": OPEN,
    "info/": OPEN,
    "app_id": OPEN,
    "app_id/": OPEN,
    "user": OPEN,
    "user/": OPEN,
    "login_check": OPEN,
    "login_check/": OPEN,
    "theme.css": OPEN,
}
# pages that load a saved deep link (files under Gradio's upload folder) when asked to
DEEP_LINKED = ("/", "/config", "/config/")


class Refused(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


class SessionOwners:
    """session_hash -> the caller who first used it, forgotten least recently used first.

    One caller's sessions beyond `per_owner` push out that caller's own oldest, so a user who
    opens sessions by the thousand cannot push out anyone else's; `total` bounds the whole.
    A forgotten session is claimed again by whoever uses it next, in practice its own page."""

    def __init__(self, per_owner: int = 1000, total: int = 100_000):
        self.per_owner, self.total = per_owner, total
        self._owner: OrderedDict[str, str] = OrderedDict()  # least recently used first
        self._of: dict[str, OrderedDict[str, None]] = {}  # owner -> their sessions, same order

    def claim(self, session: str, caller: str) -> None:
        """Bind `session` to `caller` if nobody has it; Refused if somebody else has."""
        owner = self._owner.get(session)
        if owner is None:
            self._bind(session, caller)
        elif owner != caller:
            raise Refused(403, "This page session belongs to another sign-in.")
        else:
            self._touch(session, caller)

    def check(self, session: str, caller: str) -> None:
        """Refused unless `caller` owns `session` (an unknown session is nobody's)."""
        owner = self._owner.get(session)
        if owner is None:
            raise Refused(404, "Unknown page session.")
        if owner != caller:
            raise Refused(403, "This page session belongs to another sign-in.")
        self._touch(session, caller)

    def __len__(self) -> int:
        return len(self._owner)

    def _bind(self, session: str, caller: str) -> None:
        self._owner[session] = caller
        mine = self._of.setdefault(caller, OrderedDict())
        mine[session] = None
        if len(mine) > self.per_owner:
            self._forget(next(iter(mine)))
        while len(self._owner) > self.total:
            self._forget(next(iter(self._owner)))

    def _touch(self, session: str, caller: str) -> None:
        self._owner.move_to_end(session)
        self._of[caller].move_to_end(session)

    def _forget(self, session: str) -> None:
        owner = self._owner.pop(session)
        mine = self._of[owner]
        del mine[session]
        if not mine:
            del self._of[owner]


class SessionTokens(dict[str, str]):
    """Gradio's sign-in tokens (token -> user name, the dict Gradio's routes read), each
    bound to the user's session key (`store.session_key`) when Gradio stored it, right after
    the password was checked. `get`, which every Gradio route uses to find a cookie's user,
    answers only while that key is the user's current one (`store.session_current`: one
    indexed read), and forgets the token for good otherwise: a password change, a removal
    (by the admin command, another process) or a new user of the same name signs it out, but a
    password changed from this very sign-in, which the store keeps bound to the new key.

    Each sign-in is kept in the store too (core.store.page_sessions), so a token this process
    never saw, a sign-in from before a restart, is found there (`get`, once, then in memory).
    Gradio's /logout deletes every token of the user it finds here: that ends the user's
    kept sign-ins as well, those of other processes' days included."""

    def __init__(self, store: Store, tokens: dict[str, str] | None = None):
        super().__init__()
        self._store = store
        self._keys: dict[str, str] = {}
        for token, name in (tokens or {}).items():
            self[token] = name

    def __setitem__(self, token: str, name: str) -> None:
        try:
            key = self._store.open_page_session(name, token)
        except StoreError:  # not kept: this sign-in lasts as long as the process
            key = self._store.session_key(name)
        super().__setitem__(token, name)
        if key is None:  # removed since the check: never valid
            self._keys.pop(token, None)
        else:
            self._keys[token] = key

    def _kept(self, token: str) -> str | None:
        """The user a sign-in kept in the store names (from before a restart), now in memory."""
        if not isinstance(token, str) or not token:
            return None
        found = self._store.page_session(token)
        if found is None:
            return None
        name, key = found
        super().__setitem__(token, name)
        self._keys[token] = key
        return name

    @overload
    def get(self, token: str | None, default: None = None, /) -> str | None: ...
    @overload
    def get(self, token: str | None, default: str, /) -> str: ...
    @overload
    def get(self, token: str | None, default: _T, /) -> str | _T: ...
    def get(self, token: str | None, default: object = None) -> object:
        if token is None:  # no sign-in cookie (Gradio asks with None): no token is None
            return default
        try:
            name = self._signed_in(token)
        except StoreError:  # the store cannot answer now: not signed in for this request only
            return default
        return default if name is None else name

    def _signed_in(self, token: str) -> str | None:
        name = super().get(token)
        known = name is not None
        if not known:
            name = self._kept(token)
        if name is None:
            return None
        if self._current(token, name):
            return name
        # the user's key moved on. A password changed from this very sign-in bound its row in
        # the store to the new key (core.store's `keep_only`): read it once more before ending it
        if known and (again := self._kept(token)) is not None and self._current(token, again):
            return again
        self.pop(token, None)
        return None

    def _current(self, token: str, name: str) -> bool:
        key = self._keys.get(token)
        return key is not None and self._store.session_current(name, key)

    def __delitem__(self, token: str) -> None:
        """Gradio's /logout, for each of the user's tokens: every sign-in of theirs ends."""
        name = super().get(token)
        super().__delitem__(token)
        self._keys.pop(token, None)
        if name is not None:
            self._store.end_page_sessions(name)

    @overload
    def pop(self, token: str, /) -> str: ...
    @overload
    def pop(self, token: str, default: str, /) -> str: ...
    @overload
    def pop(self, token: str, default: _T, /) -> str | _T: ...
    def pop(self, token: str, *default: Any) -> object:
        """A sign-in found no longer valid: it alone ends."""
        self._keys.pop(token, None)
        if isinstance(token, str):
            try:
                self._store.end_page_session(token)
            except StoreError:  # it is invalid in the store as well: only its row stays
                pass
        return super().pop(token, *default)


class GradioSide:
    """What the gate reads of the mounted Gradio app: who a request's cookies sign in (the
    lookup Gradio's own `get_current_user` makes) and which session an event belongs to.
    Given the store, it puts `SessionTokens` in place of Gradio's token table."""

    def __init__(self, gradio_app: App, blocks: Blocks, store: Store | None = None):
        self._app, self._blocks = gradio_app, blocks
        if store is not None:
            gradio_app.tokens = SessionTokens(store, gradio_app.tokens)
            # Gradio names its sign-in cookie with a random id per process, so a cookie from
            # before a restart would not even be read: one id per database instead (a name,
            # not a secret; two servers of one host with their own databases still differ)
            gradio_app.cookie_id = page_cookie_id(store.path)

    def user(self, cookies: dict[str, str]) -> str | None:
        token = sign_in_token(cookies, self._app.cookie_id)
        return self._app.tokens.get(token) if token else None

    def event_session(self, event_id: str) -> str | None:
        """The session of a queued or running event; None once it is done (or never was)."""
        event = self._blocks._queue.event_ids_to_events.get(event_id)
        return getattr(event, "session_hash", None)


def page_cookie_id(store_path: str | PathLike[str]) -> str:
    """The id in the name of the page's sign-in cookie for the database at `store_path`."""
    where = str(Path(store_path).resolve()).encode("utf-8", "surrogateescape")
    return hashlib.sha256(b"radixchat page cookie\0" + where).hexdigest()[:32]


def sign_in_token(cookies: Mapping[str, str], cookie_id: str) -> str | None:
    """The token of Gradio's sign-in cookie among `cookies` (None: none)."""
    return cookies.get(f"access-token-{cookie_id}") or cookies.get(f"access-token-unsecure-{cookie_id}") or None


class PageGate:
    """ASGI middleware in front of the page (see the module's docstring)."""

    def __init__(
        self, app: ASGIApp, *, side: GradioSide, no_auth: bool, max_body: int, owners: SessionOwners | None = None
    ):
        self.app, self.side, self.no_auth, self.max_body = app, side, no_auth, max_body
        self.owners = owners or SessionOwners()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = route_path(scope)
        try:
            if path.startswith(API):
                return await self._api(path[len(API) :], scope, receive, send)
            if path in DEEP_LINKED and "deep_link" in query(scope):
                raise Refused(404, "Not Found")
        except Refused as e:
            return await answer(send, e.status, e.detail, scope)
        if path == "/" and scope["method"] == "GET" and "next" in query(scope):
            back = return_to(query(scope).getlist("next"))
            if back is not None and (self.no_auth or self.side.user(request_cookies(scope)) is not None):
                return await see_other(send, scope.get("root_path", "") + back)
        if self.no_auth and path == "/":
            _, send = self._browser(scope, send)
        await self.app(scope, receive, send)

    async def _api(self, rest: str, scope: Scope, receive: Receive, send: Send) -> None:
        session = heartbeat_session(rest)
        kind = ROUTES.get(rest) or (HEARTBEAT if session else None)
        if kind is None:
            raise Refused(404, "Not Found")
        if kind == OPEN:
            return await self.app(scope, receive, send)
        caller, send = self._caller(scope, send)
        if caller is None:
            raise Refused(401, "Not authenticated")
        if kind == HEARTBEAT:
            self.owners.claim(session or "", caller)
        elif kind == DATA:
            self.owners.check(one_query_value(scope, "session_hash"), caller)
        elif scope["method"] == "POST":  # JOIN or CANCEL; Gradio answers other methods 405
            body = await read_body(scope, receive, self.max_body)
            self._check_body(kind, parse_json(body), caller)
            receive = replay(body, receive)
        await self.app(scope, receive, send)

    def _check_body(self, kind: str, body: dict[str, Any], caller: str) -> None:
        session = body.get("session_hash")
        if not isinstance(session, str):
            raise Refused(422, "session_hash must be a string.")
        if kind == JOIN:
            self.owners.claim(session, caller)
            return
        self.owners.check(session, caller)
        event = body.get("event_id")
        # /cancel closes the event it names whatever session it names with it
        if isinstance(event, str) and self.side.event_session(event) not in (None, session):
            raise Refused(403, "This event belongs to another page session.")

    def _caller(self, scope: Scope, send: Send) -> tuple[str | None, Send]:
        if self.no_auth:
            return self._browser(scope, send)
        return self.side.user(request_cookies(scope)), send

    def _browser(self, scope: Scope, send: Send) -> tuple[str, Send]:
        """This browser's id with --no-auth, and `send` that sets it first when it had none."""
        known = request_cookies(scope).get(BROWSER_COOKIE)
        if known:
            return known, send
        minted = secrets.token_urlsafe(18)
        cookie = f"{BROWSER_COOKIE}={minted}; Path=/; HttpOnly; SameSite=Lax".encode()

        async def send_with_cookie(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", cookie)]}
            await send(message)

        return minted, send_with_cookie


# the only place a signed-out visitor is sent to the sign-in page from, to come back to:
# a shared conversation's link (webui/page/routes/shared.py), a path on this server and nothing else
_RETURN = re.compile(r"/shared/[A-Za-z0-9_-]{1,128}")


def return_to(values: list[str]) -> str | None:
    """Where `/?next=...` (given once) may send a signed-in browser: a shared link's path on
    this server, or None. Never another site (`https://evil.example`, `//evil.example`,
    `/\\evil.example`), so a link to this server's sign-in cannot forward a visitor anywhere else."""
    return values[0] if len(values) == 1 and _RETURN.fullmatch(values[0]) else None


async def see_other(send: Send, path: str) -> None:
    """303 to `path` on this server (a relative Location: the browser keeps the origin)."""
    await send(
        {
            "type": "http.response.start",
            "status": 303,
            "headers": [
                (b"location", path.encode("ascii")),
                (b"cache-control", b"no-store"),
                (b"content-length", b"0"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b""})


def route_path(scope: Scope) -> str:
    """The path the routes match on: scope's path less its root_path, as Starlette does."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/"):
        return path[len(root) :]
    return path


def heartbeat_session(rest: str) -> str | None:
    """The session of a heartbeat/{session_hash} path (one non-empty segment), else None."""
    session = rest[len(HEARTBEAT) :] if rest.startswith(HEARTBEAT) else ""
    return session if session and "/" not in session else None


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first header of that name, as Starlette's Request reads it."""
    return next((v for k, v in scope["headers"] if k == name), None)


def request_cookies(scope: Scope) -> dict[str, str]:
    raw = header(scope, b"cookie")
    return cookie_parser(raw.decode("latin-1")) if raw else {}


def query(scope: Scope) -> QueryParams:
    """The query as the routes read it (Starlette decodes names and values alike)."""
    return QueryParams(scope["query_string"])


def one_query_value(scope: Scope, name: str) -> str:
    """The value of a query parameter given once; Refused if it is missing or repeated, so
    that what is checked here is what the route reads."""
    values = query(scope).getlist(name)
    if len(values) != 1:
        raise Refused(422, f"Give {name} once.")
    return values[0]


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    length = header(scope, b"content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise Refused(413, f"Request body over {limit} bytes.")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Refused(400, "The client went away.")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise Refused(413, f"Request body over {limit} bytes.")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def parse_json(body: bytes) -> dict[str, Any]:
    """The JSON object Gradio's route will read (Starlette parses with json.loads too)."""
    try:
        value = json.loads(body)
    except ValueError:
        raise Refused(400, "The body is not JSON.") from None
    if not isinstance(value, dict):
        raise Refused(422, "The body is not a JSON object.")
    return value


def replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands on the body already read, then waits as the server's does."""
    pending = True

    async def replayed() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def answer(
    send: Send, status: int, detail: str, scope: Scope | None = None, retry_after: float | None = None
) -> None:
    """A short JSON refusal (with Retry-After when given). When the request announced a body
    that is left unread, the connection closes after it, so the server does not go on reading
    a refused upload."""
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after is not None:
        headers.append((b"retry-after", str(math.ceil(retry_after)).encode()))
    if scope is not None and (
        header(scope, b"transfer-encoding") or header(scope, b"content-length") not in (None, b"0")
    ):
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
