"""`radixchat worker`: one in-process engine served over HTTP to a front end.

No page, no store, no accounts: a front end (`radixchat serve --engine URL`, its
webui/remote/remote_engine.py) keeps those and sends engine work here through the seam's calls
under /engine/ (info, stats, submit, cancel, tokenize, count_tokens, forget,
forget_conversation), as webui/remote/engine_wire.py writes them. `submit` answers with the
request's events as newline-delimited JSON; a client that disconnects cancels its request.
`POST /generate` is `submit` again for a front end behind a router (SGLang's smg forwards
that route, SGLang's own, and not /engine/*): the same request under `radixchat` in the body,
the same stream. The owner a request carries (its cache namespace and fair share) is the
front end's word, so every /engine/ call and /generate need the service key (`--service-key` or RADIXCHAT_SERVICE_KEY,
compared in constant time; a 401 in OpenAI's shape without it): without it nobody can
claim an owner. `GET /health` and `GET /v1/models` stay open, for a router (SGLang's smg)
that registers and probes workers; they say only the model's name and whether it serves.
A worker without a key starts only with `--no-auth` on loopback (Settings' own rule).

Left to others: building the engine (webui/cli/main.py, the one module of webui/ that may),
users, limits per user and rows (the front end). Threads: uvicorn's event loop runs the
routes; the blocking seam calls (tokenize, forget_conversation) run in Starlette's
worker threads; the engine's own thread runs the model. No MLX here.
"""

from __future__ import annotations

import asyncio
import hmac
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict
from typing import Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from radixchat.core.config import Settings
from radixchat.core.seam.handle import RequestHandle
from radixchat.core.seam.protocol import EngineClient
from radixchat.core.seam.requests import ChatRequest, Event, PromptRequest, RequestError, TextDelta
from radixchat.webui.api.errors import ApiError, BodyLimit, error_response, install_error_handlers
from radixchat.webui.remote.engine_wire import ROUTED_PATH, control_line, event_line, request_of, routed_request_of

PING_S = 2.0  # a quiet stream says it is alive this often: the front end tells a hung worker by silence


def service_key(settings: Settings) -> str | None:
    return settings.service_key.get_secret_value() if settings.service_key else None


def presented_key(request: Request) -> str:
    scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
    key = bearer.strip() if scheme.lower() == "bearer" else ""
    return key or request.headers.get("x-api-key", "").strip()


def build_worker(engine: EngineClient, key: str | None, max_body: int = 4 << 20) -> FastAPI:
    """The worker's app over `engine`; `key` None only for --no-auth on loopback."""
    app = FastAPI(title="radixchat worker", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    app.add_middleware(BodyLimit, limit=max_body, prefixes=("/engine/", ROUTED_PATH))

    def authorized(request: Request) -> None:
        given = presented_key(request)
        if key is not None and not hmac.compare_digest(given.encode(), key.encode()):
            why = "missing service key" if not given else "wrong service key"
            raise ApiError(401, f"{why}: send 'Authorization: Bearer <service key>'", "authentication_error", "bad_key")

    @app.get("/health")
    def health() -> JSONResponse:
        stats = engine.stats()
        body = {"status": "ok" if stats.alive else "down", "model": engine.info.model_id, "worker": True}
        return JSONResponse(body, status_code=200 if stats.alive else 503)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        m = engine.info
        return {
            "object": "list",
            "data": [{"id": m.model_id, "object": "model", "created": m.created, "owned_by": "radixchat"}],
        }

    @app.post(ROUTED_PATH, dependencies=[Depends(authorized)])
    async def routed_submit(request: Request) -> Response:
        # what a router forwards: smg keeps the body's fields and adds its own beside them
        return await _submit(engine, request, routed_request_of)

    api = FastAPI(docs_url=None, redoc_url=None, openapi_url=None, dependencies=[Depends(authorized)])
    _engine_routes(api, engine)
    install_error_handlers(api)
    app.mount("/engine", api)
    return app


def _refusal(e: RequestError) -> JSONResponse:
    return error_response(e.status, e.message, code=e.code)


async def _submit(
    engine: EngineClient, request: Request, parse: Callable[[Any], ChatRequest | PromptRequest]
) -> JSONResponse | StreamingResponse:
    try:
        req = parse(await request.json())
        handle = await engine.asubmit(req)
    except RequestError as e:
        return _refusal(e)
    except ValueError as e:  # a body that is not a request (pydantic's errors are ValueErrors)
        return error_response(400, f"not an engine request: {e}", code="invalid_value")
    return StreamingResponse(_events(handle), media_type="application/x-ndjson")


def _engine_routes(api: FastAPI, engine: EngineClient) -> None:
    @api.get("/info")
    def info() -> dict[str, Any]:
        return asdict(engine.info)

    @api.get("/stats")
    def stats() -> dict[str, Any]:
        return asdict(engine.stats())

    @api.post("/submit")
    async def submit(request: Request) -> Response:
        return await _submit(engine, request, request_of)

    @api.post("/cancel/{request_id}")
    def cancel(request_id: str) -> dict[str, Any]:
        engine.cancel(request_id)
        return {"ok": True}

    @api.post("/tokenize", response_model=None)
    def tokenize(body: dict[str, Any]) -> dict[str, Any] | JSONResponse:
        text = body.get("text")
        if not isinstance(text, str):
            return error_response(400, "text: a string", code="invalid_value")
        return {"tokens": engine.tokenize(text)}

    @api.post("/count_tokens", response_model=None)
    async def count_tokens(body: dict[str, Any]) -> dict[str, Any] | JSONResponse:
        try:
            return {"tokens": await engine.count_tokens(ChatRequest.model_validate(body))}
        except RequestError as e:
            return _refusal(e)
        except ValueError as e:
            return error_response(400, f"not a chat request: {e}", code="invalid_value")

    @api.post("/forget", response_model=None)
    def forget(body: dict[str, Any]) -> dict[str, Any] | JSONResponse:
        owner = body.get("owner")
        if not isinstance(owner, str) or not owner:
            return error_response(400, "owner: a string", code="invalid_value")
        engine.forget(owner)
        return {"ok": True}

    @api.post("/forget_conversation", response_model=None)
    def forget_conversation(body: dict[str, Any]) -> dict[str, Any] | JSONResponse:
        owner, messages = body.get("owner"), body.get("messages")
        if not (owner is None or isinstance(owner, str)) or not isinstance(messages, list):
            return error_response(400, "owner: a string or null; messages: a list", code="invalid_value")
        engine.forget_conversation(owner, messages)
        return {"ok": True}


async def _events(handle: RequestHandle) -> AsyncIterator[bytes]:
    """The request's events as NDJSON: `accepted`, deltas (those that came together in one
    write), the final event; `ping` after PING_S of silence (a long queue, a long prefill)."""
    q: asyncio.Queue[Event] = asyncio.Queue()

    async def pump() -> None:
        async for ev in handle:
            q.put_nowait(ev)

    task = asyncio.create_task(pump())
    try:
        yield control_line("accepted", id=handle.id, prompt_tokens=handle.prompt_tokens)
        while True:
            try:
                ev = await asyncio.wait_for(q.get(), PING_S)
            except TimeoutError:
                yield control_line("ping")
                continue
            lines, end = [event_line(ev)], not isinstance(ev, TextDelta)
            while not end and not q.empty():
                ev = q.get_nowait()
                lines.append(event_line(ev))
                end = not isinstance(ev, TextDelta)
            yield b"".join(lines)
            if end:
                return
    finally:
        handle.cancel()  # a no-op once it ended; a front end that left stops its request here
        task.cancel()


def serve_worker(
    settings: Settings,
    start: Callable[[Settings], EngineClient],
    options: dict[str, Any],
    started: Callable[[], None] = lambda: None,
) -> None:
    """Load the engine (`start`), serve it with uvicorn `options` until a signal (`started`
    once it listens), stop it. Refuses (SystemExit 2, one line) to serve without a service
    key unless --no-auth."""
    import signal
    import sys

    import uvicorn

    key = service_key(settings)
    if key is None and not settings.no_auth:
        print(
            "radixchat: a worker needs --service-key (or RADIXCHAT_SERVICE_KEY), the key its front end "
            "sends; --no-auth serves without one, on loopback only",
            file=sys.stderr,
        )
        sys.exit(2)
    engine = start(settings)
    m = engine.info
    line = (
        f"radixchat: worker for {m.model_id} ({m.num_params / 1e6:.1f}M params) on "
        f"http://{settings.host}:{settings.port}" + (" (no service key: --no-auth)" if key is None else "")
    )

    class Serving(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:
                started()
                print(line, flush=True)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            # the engine stops first, so that open streams end (as cancelled) instead of
            # holding uvicorn's wait for open connections
            await asyncio.wait_for(asyncio.to_thread(_stop, engine), 10.0)
            await super().shutdown(sockets)

    app = build_worker(engine, key, 4 * settings.max_body_bytes)
    server = Serving(uvicorn.Config(app, **options, timeout_graceful_shutdown=5))
    try:
        # uvicorn catches both while it serves, puts these back when done and raises what it
        # caught again: ignored, so that a stop ends here without a KeyboardInterrupt
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        server.run()
    finally:
        _stop(engine)


def _stop(engine: object) -> None:
    stop = getattr(engine, "stop", None)  # the in-process engine's, not the seam's
    if stop is not None:
        stop()
