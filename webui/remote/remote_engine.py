"""Engines on other machines, for a front end: `radixchat serve --engine URL` (repeatable).

`RemoteEngine` is the seam's EngineClient over HTTP to one `radixchat worker`
(webui/remote/worker.py), in webui/remote/engine_wire.py's JSON: `asubmit` returns a real RequestHandle
fed from the worker's NDJSON stream by a task on the caller's event loop (`submit`, for
threads, by a thread), so routes and the page read it exactly as an in-process engine's;
`cancel` asks the worker. Every call sends the service key.

Faults: an engine that does not answer at start-up, answers with a refusal of the key, or is
not a worker is a one-line start-up error (`StartError`); a worker that dies or goes silent
(no line within HANG_S: it sends a ping every few seconds) fails the requests it had with
"the engine at URL stopped answering"; while it is down, new requests get a 503 saying so,
and `stats` says it is not alive. A removed user's `forget` that could not be delivered is
retried until it is.

Left to others: the engines by URL (webui/remote/remote_engines.py), several workers of one model
behind a router (webui/remote/routed_engine.py, which builds on this class), the workers' engines. Threads: the caller's event loop reads
async streams; a thread per sync `submit`; one poller thread per engine (`radixchat-remote`)
reads its stats every POLL_S and retries undelivered forgets. No MLX here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading

import httpx

from radixchat.core.seam.handle import Outbox, RequestHandle
from radixchat.core.seam.protocol import EngineStats, ModelInfo
from radixchat.core.seam.requests import ChatRequest, Failed, PromptRequest, RequestError, TextDelta
from radixchat.webui.remote.engine_wire import SERVICE_USER_HEADER, event_of, info_of, request_body, stats_of

log = logging.getLogger("radixchat.remote")

HANG_S = 20.0  # a worker silent this long (it pings every 2 s) has hung
POLL_S = 1.0
START_TIMEOUT_S = 5.0
DOWN = EngineStats(alive=False, running=0, waiting=0)


class StartError(ValueError):
    """An engine URL that cannot serve: one line for the start-up refusal. `status`: what
    GET /engine/info answered when it answered but not as a worker (a router answers 404)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class RemoteEngine:
    """The seam's EngineClient for the worker at `url`. Make it with `connect`."""

    def __init__(self, url: str, key: str | None, info: ModelInfo):
        self.url, self._info, self.fatal = url.rstrip("/"), info, None
        self._headers = {"authorization": f"Bearer {key}"} if key else {}
        self._timeout = httpx.Timeout(HANG_S, connect=3.0)
        self._limits = httpx.Limits(max_connections=4096, max_keepalive_connections=64)
        self._client = httpx.Client(headers=self._headers, timeout=self._timeout, limits=self._limits)
        self._aclients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}
        self._outbox = Outbox()
        self._lock = threading.Lock()
        self._open: dict[str, RequestHandle] = {}
        self._tasks: set[asyncio.Task] = set()
        self._forgets: list[str] = []  # owners whose forget the worker has not confirmed yet
        self._stats = DOWN
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="radixchat-remote", daemon=True)

    @classmethod
    def connect(cls, url: str, key: str | None) -> RemoteEngine:
        """The engine at `url` once it has said what it serves; StartError when it cannot."""
        url = url.rstrip("/")
        headers = {"authorization": f"Bearer {key}"} if key else {}
        try:
            r = httpx.get(url + "/engine/info", headers=headers, timeout=START_TIMEOUT_S)
        except httpx.HTTPError as e:
            raise StartError(
                f"the engine at {url} does not answer ({type(e).__name__}): is `radixchat worker` running there?"
            ) from None
        if r.status_code == 401:
            raise StartError(
                f"the engine at {url} refused the service key: give the front end the worker's "
                "(--service-key or RADIXCHAT_SERVICE_KEY)"
            )
        try:
            info = info_of(r.json()) if r.status_code == 200 else None
        except (ValueError, TypeError):
            info = None
        if info is None:
            raise StartError(
                f"{url} is not a radixchat worker (GET /engine/info answered {r.status_code})", r.status_code
            )
        engine = cls(url, key, info)
        engine._stats = engine._read_stats()
        engine._poller.start()
        return engine

    @property
    def info(self) -> ModelInfo:
        return self._info

    def stats(self) -> EngineStats:
        return self._stats

    # ---- requests -------------------------------------------------------------------------

    async def asubmit(self, request: ChatRequest | PromptRequest) -> RequestHandle:
        loop = asyncio.get_running_loop()
        client = self._aclient(loop)
        method, url, args = self._submission(request)
        send = client.build_request(method, url, **args)
        try:
            resp = await client.send(send, stream=True)
        except httpx.HTTPError:
            raise self._unavailable() from None
        try:
            if resp.status_code != 200:
                raise self._refused(resp.status_code, await resp.aread())
            lines = resp.aiter_lines()
            handle = self._accepted(await anext(lines, ""), loop, resp)
        except BaseException as e:
            await resp.aclose()
            if isinstance(e, httpx.HTTPError):
                raise self._unavailable() from None
            raise
        task = loop.create_task(self._read(resp, lines, handle))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return handle

    def submit(self, request: ChatRequest | PromptRequest) -> RequestHandle:
        method, url, args = self._submission(request)
        send = self._client.build_request(method, url, **args)
        try:
            resp = self._client.send(send, stream=True)
        except httpx.HTTPError:
            raise self._unavailable() from None
        try:
            if resp.status_code != 200:
                raise self._refused(resp.status_code, resp.read())
            lines = resp.iter_lines()
            handle = self._accepted(next(lines, ""), None, resp)
        except BaseException as e:
            resp.close()
            if isinstance(e, httpx.HTTPError):
                raise self._unavailable() from None
            raise
        threading.Thread(target=self._read_sync, args=(resp, lines, handle), daemon=True).start()
        return handle

    def _submission(self, request) -> tuple[str, str, dict]:
        """The method, URL and httpx arguments that submit `request` (a router's differ)."""
        # the owner as a header too, for a router that keeps a user's turns on one worker
        headers = {SERVICE_USER_HEADER: request.owner} if request.owner else {}
        return "POST", self.url + "/engine/submit", {"json": request_body(request), "headers": headers}

    def _handle_id(self, worker_id: str, resp: httpx.Response) -> str:
        """The id the front end knows a request by: the worker's own (a router's names the worker)."""
        return worker_id

    def _where(self, request_id: str) -> str:
        """The engine's URL a request runs on, for messages (a router's worker)."""
        return self.url

    def _accepted(self, line: str, loop, resp: httpx.Response) -> RequestHandle:
        try:
            first = json.loads(line)
            rid, prompt_tokens = self._handle_id(str(first["id"]), resp), int(first["prompt_tokens"])
        except (ValueError, KeyError, TypeError):
            raise RequestError(f"the engine at {self.url} answered out of turn", 502, "engine_unavailable") from None
        handle = RequestHandle(rid, prompt_tokens, self.cancel, loop, self._outbox)
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
            where = self._where(handle.id)
            log.warning("the engine at %s stopped answering: request %s failed", where, handle.id)
            self._stats = DOWN
            handle.push(Failed(f"the engine at {where} stopped answering"))
            self._outbox.flush()

    async def _read(self, resp: httpx.Response, lines, handle: RequestHandle) -> None:
        try:
            async for line in lines:
                if self._take(handle, line):
                    return
        except Exception:  # a dead connection, a timeout, a garbled line: the request fails below
            pass
        finally:
            await resp.aclose()
            self._stopped(handle)

    def _read_sync(self, resp: httpx.Response, lines, handle: RequestHandle) -> None:
        try:
            for line in lines:
                if self._take(handle, line):
                    return
        except Exception:
            pass
        finally:
            resp.close()
            self._stopped(handle)

    def cancel(self, request_id: str) -> None:
        # never blocks its caller (an event loop, often): the request's stream ends with
        # its `cancelled` event once the worker has stopped it
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            threading.Thread(target=self._post, args=(f"/engine/cancel/{request_id}", {}), daemon=True).start()
            return
        task = loop.create_task(self._apost(loop, f"/engine/cancel/{request_id}"))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _apost(self, loop, path: str) -> None:
        try:
            await self._aclient(loop).post(self.url + path, json={})
        except httpx.HTTPError:  # its stream fails on its own
            pass

    # ---- the rest of the seam ------------------------------------------------------------

    async def count_tokens(self, request: ChatRequest) -> int:
        client = self._aclient(asyncio.get_running_loop())
        try:
            r = await client.post(self.url + "/engine/count_tokens", json=request.model_dump(mode="json"))
        except httpx.HTTPError:
            raise self._unavailable() from None
        if r.status_code != 200:
            raise self._refused(r.status_code, r.content)
        return int(r.json()["tokens"])

    def tokenize(self, text: str) -> list[int]:
        r = self._post("/engine/tokenize", {"text": text})
        if r is None:
            raise self._unavailable()
        if r.status_code != 200:
            raise self._refused(r.status_code, r.content)
        return r.json()["tokens"]

    def forget(self, owner: str) -> None:
        # kept until delivered: a removed user's text must not outlive them on the worker
        with self._lock:
            self._forgets.append(owner)
        self._deliver_forgets()

    def forget_conversation(self, owner: str | None, messages: list[dict]) -> None:
        r = self._post("/engine/forget_conversation", {"owner": owner, "messages": messages})
        if r is None or r.status_code != 200:
            log.warning("the engine at %s did not forget a deleted conversation", self.url)

    def _deliver_forgets(self) -> None:
        with self._lock:
            owners = list(self._forgets)
        for owner in owners:
            r = self._post("/engine/forget", {"owner": owner})
            if r is None or r.status_code != 200:
                return  # the poller tries again
            with self._lock:
                self._forgets.remove(owner)

    def _post(self, path: str, body: dict) -> httpx.Response | None:
        try:
            return self._client.post(self.url + path, json=body)
        except httpx.HTTPError:
            return None

    # ---- inside ---------------------------------------------------------------------------

    def _aclient(self, loop) -> httpx.AsyncClient:
        client = self._aclients.get(loop)
        if client is None:  # one per loop: an AsyncClient's connections belong to the loop that opened them
            client = self._aclients[loop] = httpx.AsyncClient(
                headers=self._headers, timeout=self._timeout, limits=self._limits
            )
        return client

    def _unavailable(self) -> RequestError:
        self._stats = DOWN
        return RequestError(f"the engine at {self.url} is not answering; retry shortly", 503, "engine_unavailable")

    def _refused(self, status: int, body: bytes) -> RequestError:
        if status == 401:
            return RequestError(f"the engine at {self.url} refused the service key", 503, "engine_unavailable")
        try:
            err = json.loads(body)["error"]
            return RequestError(err["message"], status, err.get("code") or "invalid_request")
        except (ValueError, KeyError, TypeError):
            return RequestError(f"the engine at {self.url} answered {status}", 502, "engine_unavailable")

    def _read_stats(self) -> EngineStats:
        try:
            r = self._client.get(self.url + "/engine/stats", timeout=2.0)
            return stats_of(r.json()) if r.status_code == 200 else DOWN
        except (httpx.HTTPError, ValueError, TypeError):
            return DOWN

    def _poll(self) -> None:
        while not self._stop.wait(POLL_S):
            was = self._stats.alive
            self._stats = self._read_stats()
            if was != self._stats.alive:
                log.warning(
                    "the engine at %s %s", self.url, "answers again" if self._stats.alive else "stopped answering"
                )
            if self._stats.alive and self._forgets:
                self._deliver_forgets()

    def halt(self) -> None:
        """The server is stopping: every request this front end has on the worker is cancelled."""
        with self._lock:
            open_ids = list(self._open)
        for rid in open_ids:
            self._post(f"/engine/cancel/{rid}", {})

    def stop(self, release: bool = False) -> None:
        self._stop.set()
        self.halt()
        self._client.close()
