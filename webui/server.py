"""The one FastAPI app that everything a client reaches hangs off.

/health (open to all), /metrics (Prometheus; this machine and --metrics-allow only), the
OpenAI-compatible /v1 routes, and the Gradio page (webui/page/) at "/", all on one port. The routes are registered before the page is
mounted, so "/" catches only what they don't. The page's sign-in checks the store's users
(off with --no-auth), behind webui/auth/signin_door.py, which refuses /login and /logout
from other sites; in front of the page, webui/auth/gate.py lets through only the Gradio routes
the page uses and answers a page session to the sign-in that opened it, and page request
bodies are capped like the API's. Outermost, every response carries a Content-Security-Policy
that lets the page load nothing but this server's files (webui/page/routes/csp.py). Errors use
OpenAI's shape. No MLX in this package: the engine is reached only through the seam,
core.seam.protocol's Engines (the served models by name) and EngineClient (submit, cancel,
tokenize, stats, info). Connection limits (slow or idle clients) are the HTTP server's, set
where uvicorn starts (webui/cli/main.py).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, cast

from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from starlette.routing import Mount

from radixchat.core.config import Settings, address_allowed, address_rule
from radixchat.core.engine.models import as_engines
from radixchat.core.seam.protocol import EngineClient, Engines
from radixchat.core.store import AccountDisabled, Store
from radixchat.webui.api.errors import BodyLimit, error_response, install_error_handlers
from radixchat.webui.api.metrics import Metrics
from radixchat.webui.api.refusals import RefusalThrottle
from radixchat.webui.api.routes import include_api
from radixchat.webui.auth.device_cookie import DeviceCookies
from radixchat.webui.auth.gate import GradioSide, PageGate
from radixchat.webui.auth.signin import SignInGuard, SignInRefused
from radixchat.webui.auth.signin_door import SignInDoor
from radixchat.webui.live_requests import LiveRequests
from radixchat.webui.page.routes.csp import ContentPolicy

if TYPE_CHECKING:
    from gradio.routes import App


def build_app(
    engines: Engines | EngineClient,
    settings: Settings,
    store: Store | None = None,
    routers: Iterable[APIRouter] = (),
) -> FastAPI:
    """The app over the served models (or one engine); `routers` are more API routers,
    included after the OpenAI ones and before the 404 of unknown /v1 paths."""
    app = FastAPI(title="radixchat", docs_url=None, redoc_url=None, openapi_url=None)
    engines = as_engines(engines)
    engine = engines.default  # the first model: /health's, the page's
    metrics = Metrics(engines)
    # what the API routes' dependencies read (webui/api/deps.py)
    app.state.engines, app.state.settings, app.state.store, app.state.metrics = engines, settings, store, metrics
    # what a user or key cut off has running stops within a second (its thread starts with the
    # first request it holds, and stops with the app)
    app.state.live = LiveRequests(store) if store is not None and not settings.no_auth else None
    install_error_handlers(app)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(RefusalThrottle)  # outside the body limit: a throttled body is never read
    # the page's sign-in guard, which trusts a browser's device cookie for the name it signed
    # in as; the door (outside the routes) refuses /login and /logout from other sites,
    # answers an address in a lockout itself and tells the guard who is signing in
    app.state.signin = (
        SignInGuard(store.authenticate, devices=DeviceCookies(store.session_key)) if store is not None else None
    )
    app.add_middleware(SignInDoor, guard=app.state.signin)

    @app.get("/health")
    def health() -> JSONResponse:
        stats = engine.stats()
        body: dict[str, Any] = {
            "status": "ok" if stats.alive else "down",
            "engine_alive": stats.alive,
            "model": engine.info.model_id,
            "model_loaded": True,
            "models": [{"id": m.model_id, "loaded": m.is_loaded} for m in engines.served()],
            # the same two counts as /metrics' num_requests_running/_waiting and the Server tab
            "active_requests": stats.running,
            "queue_depth": stats.waiting,
        }
        if stats.shards:  # under mlx.launch: how, and whether the ranks agree (no hosts or pids)
            body["shards"] = asdict(stats.shards)
        return JSONResponse(body, status_code=200 if stats.alive else 503)

    # /health stays open: load balancers probe it unsigned, and it says only what the sign-in
    # page shows anyone (the model's name) and how busy the server is. /metrics tells who
    # uses what and when (every user's request counts and timings): this machine only, and
    # whoever --metrics-allow names
    metrics_rule = address_rule(settings.metrics_allow)

    @app.get("/metrics")
    def prometheus(request: Request) -> Response:
        addr = request.client.host if request.client else None
        if not address_allowed(addr, metrics_rule, loopback=True):
            return error_response(
                403, "/metrics is served to this machine only (see --metrics-allow)", code="forbidden"
            )
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/openapi.json", include_in_schema=False)
    def openapi(request: Request) -> JSONResponse:  # the API's map: to whoever may read /metrics, not the LAN
        addr = request.client.host if request.client else None
        if not address_allowed(addr, metrics_rule, loopback=True):
            return error_response(
                403, "/openapi.json is served to this machine only (see --metrics-allow)", code="forbidden"
            )
        return JSONResponse(app.openapi())

    include_api(app, routers)  # after every other route: its last one answers unknown /v1 paths
    if store is not None:
        mount_page(app, engines, settings, store, metrics)
    app.add_middleware(ContentPolicy)  # outermost: every response, refusals included
    return app


def mount_page(app: FastAPI, engines: Engines, settings: Settings, store: Store, metrics: Metrics) -> None:
    """The Gradio page at "/", signed in against the store (unless --no-auth)."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    import gradio as gr

    from radixchat.webui.page.routes import login_notice, shared, signed_out
    from radixchat.webui.page.ui.layout import CSS, build_page, sign_in_message, theme

    guard: SignInGuard = app.state.signin  # set by build_app, which mounts the page only with a store

    async def sign_in(username: str, password: str) -> bool:
        try:
            return await guard.sign_in(username, password)
        except AccountDisabled as e:  # Gradio would say "Incorrect Credentials"
            raise HTTPException(403, f"{str(e)[:1].upper()}{str(e)[1:]}.") from None
        except SignInRefused as e:  # a lockout, or no room in the hashing queue
            raise HTTPException(429, str(e), headers={"Retry-After": str(math.ceil(e.retry_after_s))}) from None

    page = build_page(engines, settings, store, metrics, sign_in=not settings.no_auth, live=app.state.live)
    app.state.page = page
    signed_out.install(app)  # before the page's mount, which takes every path left
    login_notice.install(app)
    shared.install(app, store, no_auth=settings.no_auth)  # /shared/{token}: read-only, signed-in users
    gr.mount_gradio_app(
        app,
        page,
        path="/",
        auth=None if settings.no_auth else sign_in,
        auth_message=sign_in_message(engines.default.info),
        head=signed_out.HEAD,
        theme=theme(),
        css=CSS,
        footer_links=[],
        run_history=False,
        mcp_server=False,
        ssr_mode=False,
        show_error=True,
        # Gradio's traffic monitoring showed any signed-in user every handler's calls, an
        # admin's among them (/monitoring/summary); /metrics, loopback only, is the server's
        enable_monitoring=False,
        # what Gradio tells screen readers when an event ends: its English lacks these two, and
        # "common.complete" was read out
        i18n=gr.I18n(en={"common.complete": "Done", "common.error": "Error"}),
    )
    # the last mount is the page's: mount_gradio_app mounts its App itself, unwrapped
    gradio_app = app.state.gradio = cast(
        "App", next(r.app for r in reversed(app.routes) if isinstance(r, Mount) and r.app is not None)
    )
    # the sign-in form and the page's calls get no bigger bodies than an API request; the gate,
    # outside this limit, caps the bodies it reads itself and refuses uploads unread
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes, prefixes=("/gradio_api/", "/login"))
    if not settings.no_auth:  # why a sign-in was refused, on the sign-in page
        app.add_middleware(login_notice.LoginNotice)
    app.state.page_side = side = GradioSide(gradio_app, page, store)  # who a page cookie signs in
    app.add_middleware(
        PageGate, side=side, no_auth=settings.no_auth, max_body=settings.max_body_bytes
    )  # outermost: refusals cost nothing downstream


def end_page_streams(app: FastAPI) -> None:
    """The server is stopping: end every open page's heartbeat stream, which Gradio otherwise
    keeps open for as long as the page is open (and uvicorn waits for). Call it on the event
    loop, once the replies have ended: a page whose heartbeat ends is closed, its events too."""
    gradio_app = getattr(app.state, "gradio", None)
    if gradio_app is not None:
        gradio_app.stop_event.set()


def close_page_queue(app: FastAPI) -> None:
    """Once no connection is left: Gradio's queue stops taking and processing events, so its
    loops end on their own before the event loop closes."""
    page = getattr(app.state, "page", None)
    if page is not None and page._queue is not None:  # Gradio offers no public way to
        page._queue.close()
