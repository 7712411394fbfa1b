"""The one FastAPI app that everything a client reaches hangs off.

For now: GET /health. The OpenAI-compatible routes, metrics and the Gradio page mount
here as they land. No MLX in this package: the engine is reached only through its
thread-safe submit/cancel/stats.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from core.config import Settings
from core.engine import Engine


def build_app(engine: Engine, settings: Settings) -> FastAPI:
    app = FastAPI(title="radixchat", docs_url=None, redoc_url=None)

    @app.get("/health")
    def health():
        stats = engine.stats()
        body = {
            "status": "ok" if stats["alive"] else "down",
            "engine_alive": stats["alive"],
            "model": engine.loaded.model_id if engine.loaded else None,
            "model_loaded": engine.loaded is not None,
            "queue_depth": stats["inflight"] - stats["active"],
            "active_requests": stats["active"],
        }
        return JSONResponse(body, status_code=200 if stats["alive"] else 503)

    return app
