"""The one FastAPI app that everything a client reaches hangs off.

/health, /metrics (Prometheus), the OpenAI-compatible /v1 routes, and (as it lands) the
Gradio page, all on one port. Errors use OpenAI's shape. No MLX in this package: the
engine is reached only through its thread-safe submit/cancel/stats.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from core.config import Settings
from core.engine import Engine

from .errors import BodyLimit, install_error_handlers
from .metrics import Metrics
from .openai_api import openai_router


def build_app(engine: Engine, settings: Settings, store=None) -> FastAPI:
    app = FastAPI(title="radixchat", docs_url=None, redoc_url=None)
    metrics = Metrics(engine)
    app.state.engine, app.state.store, app.state.metrics = engine, store, metrics
    install_error_handlers(app)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.include_router(openai_router(engine, settings, store, metrics))

    @app.get("/health")
    def health():
        stats = engine.stats()
        body = {
            "status": "ok" if stats["alive"] else "down",
            "engine_alive": stats["alive"],
            "model": engine.loaded.model_id if engine.loaded else None,
            "model_loaded": engine.loaded is not None,
            "queue_depth": max(0, stats["inflight"] - stats["active"]),
            "active_requests": stats["active"],
        }
        return JSONResponse(body, status_code=200 if stats["alive"] else 503)

    @app.get("/metrics")
    def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    return app
