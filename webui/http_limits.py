"""Slow and idle clients cannot hold the server's connections: uvicorn's HTTP protocol with limits.

uvicorn closes a keep-alive connection left idle between requests (`timeout_keep_alive`,
set from --keep-alive-s where the server starts), but times nothing else: a client that
connects and never finishes its request line and headers, or stops half-way through a body,
held its connection for ever, and a few thousand of them left no room for anyone else.
`limited_protocol` makes a subclass of uvicorn's httptools protocol that
- closes a connection whose request headers are not complete `header_timeout_s` after it
  opened, or after the first byte of a later request on it;
- closes one whose request body is not complete `body_timeout_s` after its headers;
- with `max_connections` open, makes room for a new one by closing the oldest connection
  that has no request under way (idle, or still sending headers), and refuses the new one
  at once (closes it) when every open connection is busy with a request.

It relies on the callbacks uvicorn's httptools protocol has long had
(connection_made/lost, on_message_begin, on_headers_complete, on_message_complete,
on_response_complete). WebSockets are off where uvicorn starts (the app has none), so a
connection never changes protocol under these timers. What a request may do is the app's
business (webui/server.py). Runs on the server's event loop, in the protocol's callbacks.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


@dataclass(frozen=True)
class Limits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 1000


def limited_protocol(limits: Limits) -> type[HttpToolsProtocol]:
    """A protocol class for one server: its connections share one table of idle ones."""
    return type("LimitedHttpToolsProtocol", (LimitedHttpTools,), {"limits": limits, "idle": {}})


class LimitedHttpTools(HttpToolsProtocol):
    limits: Limits
    idle: dict[LimitedHttpTools, None]  # connections with no request under way, oldest first

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(cast("asyncio.Transport", transport))  # (a stream's: what uvicorn's hint says)
        if len(self.connections) > self.limits.max_connections and not self._make_room():
            self._close()
            return
        self._set_idle(True)
        self._arm(self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._set_idle(False)
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:  # a later request on a kept-alive connection
            self._arm(self.limits.header_timeout_s)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._set_idle(False)
        super().on_headers_complete()
        self._arm(self.limits.body_timeout_s)  # disarmed at once when there is no body

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # uvicorn arms its keep-alive timer only when no pipelined request follows
        if self.timeout_keep_alive_task is not None:
            self._set_idle(True)

    def _make_room(self) -> bool:
        victim = next((c for c in self.idle if c is not self), None)
        if victim is None:
            return False
        victim._close()
        return True

    def _close(self) -> None:
        """Close now and stop counting this connection (uvicorn's connection_lost comes later)."""
        self._disarm()
        self._set_idle(False)
        self.connections.discard(self)
        if not self.transport.is_closing():
            self.transport.close()

    def _set_idle(self, idle: bool) -> None:
        self.idle.pop(self, None)  # re-added last: the oldest idle stay first
        if idle:
            self.idle[self] = None

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._close)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
