"""Several workers of one model behind a router, for a front end: `radixchat serve --engine
ROUTER_URL`, where the router is SGLang's smg (`smg launch --worker-urls W1 W2 --policy
consistent_hashing --routing-key-headers x-radixchat-user`).

`RoutedEngine` holds a WorkerLink to the router (webui/remote/link.py) and one RemoteEngine
(webui/remote/remote_engine.py) per worker. Submissions go through the router: POST /generate (the one route of smg's that forwards a body it does not know and
streams the answer through as it comes), the owner in X-Radixchat-User, which smg hashes so
that each user's turns land on the worker that caches their prefix, the model named as the
workers serve it, the service key as the bearer (smg passes it on; `smg --api-key KEY` with
the same key closes the router too). What must reach one particular worker, or every one,
goes to the workers directly, at the URLs the router lists (GET /workers): a cancel to the
worker smg says it chose (its x-smg-routed-worker-id answer, kept in the request's id, since
workers number their requests alike), a removed user's forget and a deleted conversation's
to every worker, tokenize and count_tokens to any live one; `stats` sums the live workers'
running and waiting, the rest is the first live one's. So the front end must reach the
workers at the URLs the router knows them by.

Faults: a router that lists no healthy worker, workers of different models, or one that is
not a radixchat worker or refuses the key, is a one-line start-up error (StartError). A
worker that dies fails the requests it had ("the engine at WORKER stopped answering": smg
ends their streams with an error line); smg sends the next requests to the others, and a
user's again to theirs once it answers. A router with no live worker left answers a 503 with
its message. The router's list is read again every REFRESH_S: a worker added later joins.

Threads: the link's (the caller's event loop, or a thread per sync `submit`); its poller
thread re-reads the router's list; each worker's RemoteEngine polls its own stats and retries
its undelivered forgets. No MLX here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from typing import Any

import httpx

from radixchat.core.seam.handle import RequestHandle
from radixchat.core.seam.protocol import EngineStats, ModelInfo
from radixchat.core.seam.requests import ChatRequest, PromptRequest, RequestError
from radixchat.webui.remote.engine_wire import ROUTED_PATH, ROUTED_WORKER_HEADER, routed_body
from radixchat.webui.remote.link import Submission, WorkerLink, owner_headers, service_headers
from radixchat.webui.remote.remote_engine import DOWN, START_TIMEOUT_S, RemoteEngine, StartError, refusal

log = logging.getLogger("radixchat.routed")

REFRESH_S = 5.0
NO_WORKER_CODES = ("model_not_found", "no_available_workers", "no_models_available")  # smg's


def router_workers(url: str, key: str | None) -> list[str] | None:
    """The URLs of the healthy workers the router at `url` lists (smg's GET /workers); None
    when `url` does not answer as a router; StartError when it refuses the key."""
    try:
        r = httpx.get(url + "/workers", headers=service_headers(key), timeout=START_TIMEOUT_S)
        data = r.json() if r.status_code in (200, 401) else None
    except (httpx.HTTPError, ValueError):
        return None
    if r.status_code == 401:
        raise StartError(
            f"the router at {url} refused the service key: start smg with --api-key set to the "
            "service key (or without --api-key)"
        )
    if not isinstance(data, dict) or not isinstance(data.get("workers"), list):
        return None
    listed = [w for w in data["workers"] if isinstance(w, dict) and isinstance(w.get("url"), str)]
    return [w["url"].rstrip("/") for w in listed if w.get("is_healthy", True)]


class RouterRoute:
    """Requests sent through the router at `url` to the workers serving `model_id` (the
    link's Route)."""

    def __init__(self, url: str, model_id: str):
        self.url, self.model_id = url, model_id

    def submission(self, request: ChatRequest | PromptRequest) -> Submission:
        return Submission(self.url + ROUTED_PATH, routed_body(request, self.model_id), owner_headers(request))

    def request_id(self, worker_id: str, resp: httpx.Response) -> str:
        # workers count their requests alike ("req-1" on each): the worker's URL makes it unique
        # and says where to cancel it
        return f"{worker_id}@{resp.headers.get(ROUTED_WORKER_HEADER, '').rstrip('/')}"

    def where(self, request_id: str) -> str:
        return request_id.partition("@")[2] or self.url

    def unavailable(self) -> RequestError:
        return RequestError(f"the router at {self.url} is not answering; retry shortly", 503, "engine_unavailable")

    def refused(self, status: int, body: bytes) -> RequestError:
        try:
            err = json.loads(body)["error"]
            message, code = str(err["message"]), err.get("code")
        except (ValueError, KeyError, TypeError):
            message, code = "", None
        if status >= 500 or code in NO_WORKER_CODES:  # smg's: none left, or the one it chose is gone
            return RequestError(
                f"no worker behind the router at {self.url} is serving now ({message or status}); retry shortly",
                503,
                "engine_unavailable",
            )
        return refusal(self.url, status, body)


class RoutedEngine:
    """The seam's EngineClient for the workers behind the router at `url`. Make it with
    `connect_router`."""

    def __init__(self, url: str, key: str | None, workers: dict[str, RemoteEngine]):
        self.url, self._key = url.rstrip("/"), key
        self.fatal: str | None = None
        self._info = next(iter(workers.values())).info
        self._link = WorkerLink(self.url, key, RouterRoute(self.url, self._info.model_id))
        self._lock = threading.Lock()
        self._workers = workers  # URL -> that worker's engine; grows under self._lock
        self._refused_urls: set[str] = set()  # listed workers that could not join yet (said once)
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="radixchat-routed", daemon=True)

    @classmethod
    def connect_router(cls, url: str, key: str | None, worker_urls: list[str]) -> RoutedEngine:
        if not worker_urls:
            raise StartError(
                f"the router at {url} has no healthy worker: start `radixchat worker`s (same service key) "
                "and give smg their URLs (--worker-urls)"
            )
        workers: dict[str, RemoteEngine] = {}
        try:
            for w in worker_urls:
                try:
                    workers[w] = RemoteEngine.connect(w, key)
                except StartError as e:
                    raise StartError(f"behind the router at {url}: {e}") from None
            models = sorted({e.info.model_id for e in workers.values()})
            if len(models) > 1:
                raise StartError(
                    f"the workers behind the router at {url} serve {', '.join(models)}: one model a router"
                )
        except StartError:
            for worker in workers.values():
                worker.stop()
            raise
        engine = cls(url, key, workers)
        engine._poller.start()
        return engine

    @property
    def info(self) -> ModelInfo:
        return self._info

    # ---- requests through the router -----------------------------------------------------

    async def asubmit(self, request: ChatRequest | PromptRequest) -> RequestHandle:
        return await self._link.asubmit(request, self.cancel)

    def submit(self, request: ChatRequest | PromptRequest) -> RequestHandle:
        return self._link.submit(request, self.cancel)

    def cancel(self, request_id: str) -> None:
        worker_id, _, url = request_id.partition("@")
        engine = self._worker(url)
        if engine is not None:
            engine.cancel(worker_id)
        else:  # a router that does not say where: the request runs to its end there
            log.warning("request %s cannot be cancelled: the router did not say which worker runs it", request_id)

    def halt(self) -> None:
        for rid in self._link.open_ids():
            worker_id, _, url = rid.partition("@")
            engine = self._worker(url)
            if engine is not None:
                engine.cancel_now(worker_id)

    # ---- calls to the workers themselves -------------------------------------------------

    def _worker(self, url: str) -> RemoteEngine | None:
        with self._lock:
            return self._workers.get(url)

    def _all(self) -> list[RemoteEngine]:
        with self._lock:
            return list(self._workers.values())

    def _live(self) -> RemoteEngine:
        for engine in self._all():
            if engine.stats().alive:
                return engine
        raise RequestError(
            f"no worker behind the router at {self.url} is answering; retry shortly", 503, "engine_unavailable"
        )

    def stats(self) -> EngineStats:
        live = [s for s in (e.stats() for e in self._all()) if s.alive]
        if not live:
            return DOWN
        return dataclasses.replace(live[0], running=sum(s.running for s in live), waiting=sum(s.waiting for s in live))

    def tokenize(self, text: str) -> list[int]:
        return self._live().tokenize(text)

    async def count_tokens(self, request: ChatRequest) -> int:
        return await self._live().count_tokens(request)

    def forget(self, owner: str) -> None:
        for engine in self._all():  # each keeps it until its worker confirms
            engine.forget(owner)

    def forget_conversation(self, owner: str | None, messages: list[dict[str, Any]]) -> None:
        for engine in self._all():
            engine.forget_conversation(owner, messages)

    # ---- the router's list ---------------------------------------------------------------

    def _poll(self) -> None:
        while not self._stop.wait(REFRESH_S):
            try:
                listed = router_workers(self.url, self._key) or []
            except StartError:
                continue
            for url in listed:
                if self._worker(url) is None:
                    self._join(url)

    def _join(self, url: str) -> None:
        try:
            engine = RemoteEngine.connect(url, self._key)
        except StartError as e:
            if url not in self._refused_urls:
                log.warning("a worker the router at %s lists cannot join (tried again): %s", self.url, e)
            self._refused_urls.add(url)
            return
        if engine.info.model_id != self._info.model_id:
            if url not in self._refused_urls:
                log.warning(
                    "the worker at %s serves %s, not %s: left out", url, engine.info.model_id, self._info.model_id
                )
            self._refused_urls.add(url)
            engine.stop()
            return
        with self._lock:
            self._workers[url] = engine
        log.warning("the worker at %s joined the router at %s", url, self.url)

    def stop(self, release: bool = False) -> None:
        self._stop.set()
        self.halt()
        self._link.close()
        for engine in self._all():
            engine.stop()
