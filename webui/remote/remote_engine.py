"""Engines on other machines, for a front end: `radixchat serve --engine URL` (repeatable).

`RemoteEngine` is the seam's EngineClient over HTTP to one `radixchat worker`
(webui/remote/worker.py), in webui/remote/engine_wire.py's JSON, over a WorkerLink
(webui/remote/link.py): `asubmit` returns a real RequestHandle fed from the worker's NDJSON
stream, so routes and the page read it exactly as an in-process engine's; `cancel` asks the
worker. Every call sends the service key.

Faults: an engine that does not answer at start-up, answers with a refusal of the key, or is
not a worker is a one-line start-up error (`StartError`); a worker that dies or goes silent
(no line within HANG_S: it sends a ping every few seconds) fails the requests it had with
"the engine at URL stopped answering"; while it is down, new requests get a 503 saying so,
and `stats` says it is not alive. A removed user's `forget` that could not be delivered is
retried until it is.

Left to others: the engines by URL (webui/remote/remote_engines.py), several workers of one model
behind a router (webui/remote/routed_engine.py, which holds one of these per worker), the
workers' engines. Threads: the link's (the caller's event loop, or a thread per sync
`submit`); one poller thread per engine (`radixchat-remote`) reads its stats every POLL_S and
retries undelivered forgets. No MLX here.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import httpx

from radixchat.core.seam.handle import RequestHandle
from radixchat.core.seam.protocol import EngineStats, ModelInfo
from radixchat.core.seam.requests import ChatRequest, PromptRequest, RequestError
from radixchat.webui.remote.engine_wire import info_of, request_body, stats_of
from radixchat.webui.remote.link import Submission, WorkerLink, owner_headers, service_headers

log = logging.getLogger("radixchat.remote")

POLL_S = 1.0
START_TIMEOUT_S = 5.0
DOWN = EngineStats(alive=False, running=0, waiting=0)


class StartError(ValueError):
    """An engine URL that cannot serve: one line for the start-up refusal. `status`: what
    GET /engine/info answered when it answered but not as a worker (a router answers 404)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def refusal(url: str, status: int, body: bytes) -> RequestError:
    """What a worker's answer other than 200 means to the front end's caller: the worker's own
    error where it sent one in OpenAI's shape."""
    if status == 401:
        return RequestError(f"the engine at {url} refused the service key", 503, "engine_unavailable")
    try:
        err = json.loads(body)["error"]
        return RequestError(err["message"], status, err.get("code") or "invalid_request")
    except (ValueError, KeyError, TypeError):
        return RequestError(f"the engine at {url} answered {status}", 502, "engine_unavailable")


class WorkerRoute:
    """A worker reached at its own URL (the link's Route)."""

    def __init__(self, url: str):
        self.url = url

    def submission(self, request: ChatRequest | PromptRequest) -> Submission:
        return Submission(self.url + "/engine/submit", request_body(request), owner_headers(request))

    def request_id(self, worker_id: str, resp: httpx.Response) -> str:
        return worker_id

    def where(self, request_id: str) -> str:
        return self.url

    def refused(self, status: int, body: bytes) -> RequestError:
        return refusal(self.url, status, body)

    def unavailable(self) -> RequestError:
        return RequestError(f"the engine at {self.url} is not answering; retry shortly", 503, "engine_unavailable")


class RemoteEngine:
    """The seam's EngineClient for the worker at `url`. Make it with `connect`."""

    def __init__(self, url: str, key: str | None, info: ModelInfo):
        self.url, self._info = url.rstrip("/"), info
        self.fatal: str | None = None
        self._link = WorkerLink(self.url, key, WorkerRoute(self.url), on_down=self._down)
        self._lock = threading.Lock()
        self._forgets: list[str] = []  # owners whose forget the worker has not confirmed yet
        self._stats = DOWN
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="radixchat-remote", daemon=True)

    @classmethod
    def connect(cls, url: str, key: str | None) -> RemoteEngine:
        """The engine at `url` once it has said what it serves; StartError when it cannot."""
        url = url.rstrip("/")
        try:
            r = httpx.get(url + "/engine/info", headers=service_headers(key), timeout=START_TIMEOUT_S)
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
        return await self._link.asubmit(request, self.cancel)

    def submit(self, request: ChatRequest | PromptRequest) -> RequestHandle:
        return self._link.submit(request, self.cancel)

    def cancel(self, request_id: str) -> None:
        # never blocks its caller (an event loop, often): the request's stream ends with
        # its `cancelled` event once the worker has stopped it
        self._link.post_soon(f"/engine/cancel/{request_id}")

    def cancel_now(self, request_id: str) -> None:
        """`cancel`, waiting until the worker has answered (for `halt`, off any event loop)."""
        self._link.post(f"/engine/cancel/{request_id}", {})

    # ---- the rest of the seam ------------------------------------------------------------

    async def count_tokens(self, request: ChatRequest) -> int:
        return int((await self._link.acall("/engine/count_tokens", request.model_dump(mode="json")))["tokens"])

    def tokenize(self, text: str) -> list[int]:
        tokens: list[int] = self._link.call("/engine/tokenize", {"text": text})["tokens"]
        return tokens

    def forget(self, owner: str) -> None:
        # kept until delivered: a removed user's text must not outlive them on the worker
        with self._lock:
            self._forgets.append(owner)
        self._deliver_forgets()

    def forget_conversation(self, owner: str | None, messages: list[dict[str, Any]]) -> None:
        r = self._link.post("/engine/forget_conversation", {"owner": owner, "messages": messages})
        if r is None or r.status_code != 200:
            log.warning("the engine at %s did not forget a deleted conversation", self.url)

    def _deliver_forgets(self) -> None:
        with self._lock:
            owners = list(self._forgets)
        for owner in owners:
            r = self._link.post("/engine/forget", {"owner": owner})
            if r is None or r.status_code != 200:
                return  # the poller tries again
            with self._lock:
                self._forgets.remove(owner)

    # ---- inside ---------------------------------------------------------------------------

    def _down(self) -> None:
        self._stats = DOWN

    def _read_stats(self) -> EngineStats:
        r = self._link.get("/engine/stats", timeout=2.0)
        try:
            return stats_of(r.json()) if r is not None and r.status_code == 200 else DOWN
        except (ValueError, TypeError):
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
        for rid in self._link.open_ids():
            self.cancel_now(rid)

    def stop(self, release: bool = False) -> None:
        self._stop.set()
        self.halt()
        self._link.close()
