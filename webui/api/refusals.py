"""A client whose API requests keep being refused pays for the refusals: `RefusalThrottle`.

A refused request costs the server its work before the refusal: reading a body of up to
--max-body-bytes, parsing its JSON, checking it. One user re-sending 1 MB bodies that are
refused at once (the per-user limit counts only requests that are accepted, so it never
binds) kept the event loop parsing ~150 MB a second, and another user's first token went
from 0.03 to 0.3-0.5 s with the engine idle (loadtests/bench_fairness --flood-kind bodies).

So each client has a bucket of refusals: `burst` of them at once, refilled at `per_s` a
second; a 4xx answer other than 429 takes one. A client with an empty bucket gets 429 with
Retry-After (OpenAI's shape, code `too_many_refused`) before its body is read, until the
bucket has refilled one. Accepted requests never drain it, so a client that is sometimes
wrong never notices. The client is its credential (the `Authorization` or `x-api-key`
header, kept as a hash: every request of a user with that key, whoever sends it), else its
address. A refused request whose key named a user (the API's sign-in ran) also takes one from
that user's bucket, and the credential is remembered as theirs: once the user's bucket is
empty, every key of theirs is answered 429 before its body is read (a user with many keys
was many clients; a new key costs one refused request before it is known). A trusted front
end's end users are clients of their own: once a credential has been seen to be a front end's
(the API's sign-in says so), the client is the credential and the end user its headers name,
so one of Open WebUI's users refused again and again does not 429 the others. An ordinary
key's such headers name nobody, here as in the API. At most `max_clients` of each are
remembered, least recently used forgotten first.

A user's requests in flight are counted here too, and so is their limit (theirs, or
--max-user-requests), both learnt from the API's sign-in: a POST from a user who already has
that many is answered 429 `user_limit` before its body is read (GENERATING's), as the engine
would answer it after; the limit is read from the store again first, since an admin may have
raised it. Before, only the engine counted, after the body was parsed and checked: a user at
their limit sending 64 KB schemas again and again (18 a second, 68% of them refused) kept
the event loop ~75% busy on the bundled model (py-spy), slowing everyone's steps. A request
stops counting when its answer's last part goes out, before the client can see it, so a
client that sends its next one at once is not refused for it. A new key is counted from its
first answer on.

ASGI middleware on the API's paths, outside the body limit; runs on the server's event loop.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import TypeVar

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixchat.core.seam.requests import UserLimit
from radixchat.webui.api.deps import end_user_header
from radixchat.webui.api.errors import count_refusal, send_error

REFUSALS = frozenset({400, 401, 403, 404, 405, 409, 413, 415, 422})
# the requests the engine counts against a user's limit
GENERATING = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"}
)
V = TypeVar("V")


class RefusalThrottle:
    def __init__(
        self,
        app: ASGIApp,
        burst: float = 60.0,
        per_s: float = 10.0,
        prefixes: tuple[str, ...] = ("/v1/",),
        max_clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app, self.burst, self.per_s, self.prefixes = app, burst, per_s, prefixes
        self.max_clients, self.clock = max_clients, clock
        self._buckets: OrderedDict[bytes, tuple[float, float]] = OrderedDict()  # client -> (tokens, when)
        self._users: OrderedDict[bytes, bytes] = OrderedDict()  # a credential's client -> its user's
        self._fronts: OrderedDict[bytes, bool] = OrderedDict()  # credentials known as a front end's
        self._limits: OrderedDict[bytes, int] = OrderedDict()  # a user's bucket -> their request limit
        self._names: OrderedDict[bytes, str] = OrderedDict()  # a user's bucket -> their name
        self._inflight: Counter[bytes] = Counter()  # a user's bucket -> their POSTs under way
        self.throttled = 0  # requests answered 429 here

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefixes):
            return await self.app(scope, receive, send)
        credential = self._credential(scope)
        client = self._client(scope, credential)
        user = self._users.get(client)
        tokens = min(self._tokens(client), self._tokens(user) if user else self.burst)
        if tokens < 1.0:
            self.throttled += 1
            if scope.get("app") is not None:
                count_refusal(scope["app"], scope["path"], "too_many_refused")
            return await self._refuse(send, math.ceil((1.0 - tokens) / self.per_s), scope["path"])
        counted = user if scope["path"] in GENERATING and scope.get("method") == "POST" else None
        if counted is not None:
            if self._inflight[counted] >= self._limits.get(counted, math.inf) and (
                self._inflight[counted] >= await self._fresh_limit(scope, counted)
            ):
                if scope.get("app") is not None:
                    count_refusal(scope["app"], scope["path"], "user_limit")
                return await self._at_limit(send, self._inflight[counted], scope["path"])
            self._inflight[counted] += 1

        def done() -> None:
            nonlocal counted
            if counted is not None:
                self._inflight[counted] -= 1
                if self._inflight[counted] <= 0:
                    del self._inflight[counted]
                counted = None

        async def counting_send(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                self._learn_limit(client, scope)
            if msg["type"] == "http.response.body" and not msg.get("more_body"):
                done()  # before the client can have it (and send its next request)
            if msg["type"] == "http.response.start" and credential:
                if (scope.get("state") or {}).get("front_end"):
                    self._remember(self._fronts, credential, True)  # its next requests: by end user
                elif msg["status"] == 401:  # revoked: its headers name nobody any more
                    self._fronts.pop(credential, None)
            if msg["type"] == "http.response.start" and msg["status"] in REFUSALS:
                self._take(client)
                user = self._user_of(client, scope)
                if user is not None:
                    self._take(user)
            await send(msg)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            done()

    def _learn_limit(self, client: bytes, scope: Scope) -> None:
        """The request limit of the user the API's sign-in found (theirs, else the server's)."""
        user = (scope.get("state") or {}).get("user")
        app = scope.get("app")
        if user is None or client[:1] != b"k" or app is None:
            return
        bucket = self._user_of(client, scope)
        if bucket is not None:
            self._remember(self._limits, bucket, user.request_limit or app.state.settings.max_user_requests)
            self._remember(self._names, bucket, user.name)

    async def _fresh_limit(self, scope: Scope, bucket: bytes) -> float:
        """The user's limit as the store has it now, asked where the one learnt would refuse:
        an admin may have raised it since (one read of SQLite, in a worker thread)."""
        app, name = scope.get("app"), self._names.get(bucket)
        store = getattr(app.state, "store", None) if app is not None else None
        if store is None or name is None:
            return self._limits.get(bucket, math.inf)
        assert app is not None  # the store came from it
        limit = await anyio.to_thread.run_sync(store.request_limit, name)
        self._remember(self._limits, bucket, limit or app.state.settings.max_user_requests)
        return self._limits[bucket]

    @staticmethod
    def _credential(scope: Scope) -> bytes | None:
        headers = dict(scope.get("headers") or [])
        credential = headers.get(b"authorization") or headers.get(b"x-api-key")
        return b"k" + hashlib.sha256(credential).digest()[:16] if credential else None

    def _client(self, scope: Scope, credential: bytes | None) -> bytes:
        if credential is None:
            return b"a" + (scope.get("client") or ("?", 0))[0].encode()
        if credential not in self._fronts:
            return credential
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        return credential + b"/" + hashlib.sha256(end_user_header(headers).encode()).digest()[:16]

    def _user_of(self, client: bytes, scope: Scope) -> bytes | None:
        """The bucket of the user the API's sign-in found for this request (webui/api/deps.py
        keeps it on the request's state), learnt as the credential's; None before sign-in ran."""
        user = (scope.get("state") or {}).get("user")
        if user is None or client[:1] != b"k":
            return self._users.get(client)
        bucket = b"u" + str(user.id).encode()
        self._remember(self._users, client, bucket)
        return bucket

    def _tokens(self, client: bytes) -> float:
        """The client's refusals left now (refilled since it was last seen)."""
        entry = self._buckets.get(client)
        if entry is None:
            return self.burst
        tokens, when = entry
        return min(self.burst, tokens + (self.clock() - when) * self.per_s)

    def _take(self, client: bytes) -> None:
        self._remember(self._buckets, client, (self._tokens(client) - 1.0, self.clock()))

    def _remember(self, table: OrderedDict[bytes, V], key: bytes, value: V) -> None:
        """`table[key] = value`, most recent last; the least recent beyond `max_clients` forgotten."""
        table[key] = value
        table.move_to_end(key)
        while len(table) > self.max_clients:
            table.popitem(last=False)

    async def _at_limit(self, send: Send, mine: int, path: str) -> None:
        error = UserLimit(mine)
        await send_error(
            send,
            429,
            error.message,
            "requests",
            error.code,
            headers=[(b"retry-after", b"2"), (b"connection", b"close")],  # its body is not read
            path=path,
        )

    async def _refuse(self, send: Send, retry_after: int, path: str) -> None:
        await send_error(
            send,
            429,
            f"too many refused requests from this client: try again in {retry_after} s",
            "rate_limit_error",
            "too_many_refused",
            # its body is not read: the connection cannot be reused
            headers=[(b"retry-after", str(retry_after).encode()), (b"connection", b"close")],
            path=path,
        )
