"""The API routers alone on an app, for the web layer's in-process tests: the state their
dependencies read, the error handlers and, where asked, the body limit, as build_app has
them, without the page."""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import APIRouter, FastAPI

from radixchat.core.config import Settings
from radixchat.core.engine.models import as_engines
from radixchat.webui.api.errors import BodyLimit, install_error_handlers
from radixchat.webui.api.metrics import Metrics
from radixchat.webui.api.routes import include_api


def api_app(
    engine, store=None, *, no_auth: bool = False, extra: Iterable[APIRouter] = (), body_limit: bool = False
) -> FastAPI:
    app = FastAPI()
    settings = Settings(no_auth=no_auth)
    app.state.engines, app.state.settings, app.state.store = as_engines(engine), settings, store
    app.state.metrics = Metrics(engine)
    install_error_handlers(app)
    if body_limit:
        app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    include_api(app, extra)
    return app
