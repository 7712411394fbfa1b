"""One HTTP link to a `radixchat worker`, or to a router in front of workers: its clients, and
the requests streamed over it into the seam's handles.

`WorkerLink` sends a request as its `Route` says (the worker's own /engine/submit, or the
router's /generate), reads the answer's NDJSON into a real RequestHandle (a task on the
caller's event loop for `asubmit`, a thread for `submit`), keeps the handles still open (for
`halt`), and turns a link that fails or goes silent into the request's failure. The engines
that use it (webui/remote/remote_engine.py for one worker, webui/remote/routed_engine.py for a
router) each hold one: they share the link by composition and say only what differs, in their
Route.

Threads: the caller's event loop reads async streams; a thread per sync `submit`. Safe from
any thread. No MLX here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from radixchat.core.seam.handle import Outbox, RequestHandle
from radixchat.core.seam.requests import ChatRequest, Failed, PromptRequest, RequestError, TextDelta
from radixchat.webui.remote.engine_wire import SERVICE_USER_HEADER, event_of

log = logging.getLogger("radixchat.remote")

HANG_S = 20.0  # a worker silent this long (it pings every 2 s) has hung


@dataclass(frozen=True)
class Submission:
    """Where and how one request is sent."""

    url: str
    json: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


class Route(Protocol):
    """What differs between a worker reached at its own URL and workers behind a router."""

    def submission(self, request: ChatRequest | PromptRequest) -> Submission:
        """Where `request` is sent, and its body."""
        ...

    def request_id(self, worker_id: str, resp: httpx.Response) -> str:
        """The id the front end knows a request by, from the worker's own and the answer."""
        ...

    def where(self, request_id: str) -> str:
        """The URL of the engine a request runs on, for messages."""
        ...

    def refused(self, status: int, body: bytes) -> RequestError:
        """The error an answer other than 200 stands for."""
        ...

    def unavailable(self) -> RequestError:
        """The error for a link that does not answer."""
        ...


def no_op() -> None:
    return None


def service_headers(key: str | None) -> dict[str, str]:
    """The service key as every call to a worker or a router sends it (none: --no-auth)."""
    return {"authorization": f"Bearer {key}"} if key else {}


def owner_headers(request: ChatRequest | PromptRequest) -> dict[str, str]:
    """The request's owner as a header too, for a router that keeps a user's turns on one
    worker (smg hashes it)."""
    return {SERVICE_USER_HEADER: request.owner} if request.owner else {}


class WorkerLink:
    """One link to `url`, every call with the service key. `on_down` is told when the link
    fails (a request could not be sent, or a stream stopped answering)."""

    def __init__(self, url: str, key: str | None, route: Route, on_down: Callable[[], None] = no_op):
        self.url, self.route, self._on_down = url.rstrip("/"), route, on_down
        self._headers = service_headers(key)
        self._timeout = httpx.Timeout(HANG_S, connect=3.0)
        self._limits = httpx.Limits(max_connections=4096, max_keepalive_connections=64)
        self._client = httpx.Client(headers=self._headers, timeout=self._timeout, limits=self._limits)
        self._aclients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}
        self._outbox = Outbox()
        self._lock = threading.Lock()
        self._open: dict[str, RequestHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # ---- streamed requests --------------------------------------------------------------------

    async def asubmit(self, request: ChatRequest | PromptRequest, cancel: Callable[[str], None]) -> RequestHandle:
        """Send `request`; its handle (whose `cancel` is `cancel`) is fed on the calling loop."""
        loop = asyncio.get_running_loop()
        client = self._aclient(loop)
        sub = self.route.submission(request)
        send = client.build_request("POST", sub.url, json=sub.json, headers=sub.headers)
        try:
            resp = await client.send(send, stream=True)
        except httpx.HTTPError:
            raise self.unavailable() from None
        try:
            if resp.status_code != 200:
                raise self.route.refused(resp.status_code, await resp.aread())
            lines = resp.aiter_lines()
            handle = self._accepted(await anext(lines, ""), loop, resp, cancel)
        except BaseException as e:
            await resp.aclose()
            if isinstance(e, httpx.HTTPError):
                raise self.unavailable() from None
            raise
        self._keep(loop.create_task(self._read(resp, lines, handle)))
        return handle

    def submit(self, request: ChatRequest | PromptRequest, cancel: Callable[[str], None]) -> RequestHandle:
        """`asubmit` for threads: a thread of its own feeds the handle."""
        sub = self.route.submission(request)
        send = self._client.build_request("POST", sub.url, json=sub.json, headers=sub.headers)
        try:
            resp = self._client.send(send, stream=True)
        except httpx.HTTPError:
            raise self.unavailable() from None
        try:
            if resp.status_code != 200:
                raise self.route.refused(resp.status_code, resp.read())
            lines = resp.iter_lines()
            handle = self._accepted(next(lines, ""), None, resp, cancel)
        except BaseException as e:
            resp.close()
            if isinstance(e, httpx.HTTPError):
                raise self.unavailable() from None
            raise
        threading.Thread(target=self._read_sync, args=(resp, lines, handle), daemon=True).start()
        return handle

    def open_ids(self) -> list[str]:
        """The requests whose streams have not ended."""
        with self._lock:
            return list(self._open)

    def _accepted(
        self,
        line: str,
        loop: asyncio.AbstractEventLoop | None,
        resp: httpx.Response,
        cancel: Callable[[str], None],
    ) -> RequestHandle:
        try:
            first = json.loads(line)
            rid, prompt_tokens = self.route.request_id(str(first["id"]), resp), int(first["prompt_tokens"])
        except (ValueError, KeyError, TypeError):
            raise RequestError(f"the engine at {self.url} answered out of turn", 502, "engine_unavailable") from None
        handle = RequestHandle(rid, prompt_tokens, cancel, loop, self._outbox)
        with self._lock:
            self._open[rid] = handle
        handle.add_done_callback(lambda _final: self._closed(rid))
        return handle

    def _closed(self, rid: str) -> None:
        with self._lock:
            self._open.pop(rid, None)

    def _take(self, handle: RequestHandle, line: str) -> bool:
        """One line of the stream into the handle; True once it carried the final event."""
        if not line:
            return False
        data = json.loads(line)
        if data.get("type") == "ping":
            return False
        ev = event_of(data)
        handle.push(ev)
        self._outbox.flush()
        return not isinstance(ev, TextDelta)

    def _stopped(self, handle: RequestHandle) -> None:
        if handle.final is None:
            where = self.route.where(handle.id)
            log.warning("the engine at %s stopped answering: request %s failed", where, handle.id)
            self._on_down()
            handle.push(Failed(f"the engine at {where} stopped answering"))
            self._outbox.flush()

    async def _read(self, resp: httpx.Response, lines: AsyncIterator[str], handle: RequestHandle) -> None:
        try:
            async for line in lines:
                if self._take(handle, line):
                    return
        except Exception:  # a dead connection, a timeout, a garbled line: the request fails below
            pass
        finally:
            await resp.aclose()
            self._stopped(handle)

    def _read_sync(self, resp: httpx.Response, lines: Iterator[str], handle: RequestHandle) -> None:
        try:
            for line in lines:
                if self._take(handle, line):
                    return
        except Exception:
            pass
        finally:
            resp.close()
            self._stopped(handle)

    # ---- plain calls ----------------------------------------------------------------------------

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response | None:
        """POST `body` to `path`, waiting for the answer; None when the link failed."""
        try:
            return self._client.post(self.url + path, json=body)
        except httpx.HTTPError:
            return None

    def get(self, path: str, timeout: float) -> httpx.Response | None:
        try:
            return self._client.get(self.url + path, timeout=timeout)
        except httpx.HTTPError:
            return None

    def call(self, path: str, body: dict[str, Any]) -> Any:
        """POST and return the answer's JSON; the route's errors when refused or unanswered."""
        r = self.post(path, body)
        if r is None:
            raise self.unavailable()
        if r.status_code != 200:
            raise self.route.refused(r.status_code, r.content)
        return r.json()

    async def acall(self, path: str, body: dict[str, Any]) -> Any:
        """`call` for asyncio callers."""
        client = self._aclient(asyncio.get_running_loop())
        try:
            r = await client.post(self.url + path, json=body)
        except httpx.HTTPError:
            raise self.unavailable() from None
        if r.status_code != 200:
            raise self.route.refused(r.status_code, r.content)
        return r.json()

    def post_soon(self, path: str) -> None:
        """POST `{}` to `path` without waiting (a cancel: never blocks an event loop); a
        failure is left to the request's stream, which fails on its own."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            threading.Thread(target=self.post, args=(path, {}), daemon=True).start()
            return
        self._keep(loop.create_task(self._apost(loop, path)))

    async def _apost(self, loop: asyncio.AbstractEventLoop, path: str) -> None:
        try:
            await self._aclient(loop).post(self.url + path, json={})
        except httpx.HTTPError:
            pass

    def unavailable(self) -> RequestError:
        self._on_down()
        return self.route.unavailable()

    # ---- inside ---------------------------------------------------------------------------------

    def _aclient(self, loop: asyncio.AbstractEventLoop) -> httpx.AsyncClient:
        client = self._aclients.get(loop)
        if client is None:  # one per loop: an AsyncClient's connections belong to the loop that opened them
            client = self._aclients[loop] = httpx.AsyncClient(
                headers=self._headers, timeout=self._timeout, limits=self._limits
            )
        return client

    def _keep(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)  # held until done: the loop keeps only a weak reference
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        self._client.close()
