"""The API's routers, put on an app in an order that keeps every one reachable.

Each concern has its module-level APIRouter: models (webui/api/models.py), chat completions
and completions (webui/api/chat.py), responses (webui/api/responses.py), Anthropic's
messages (webui/api/messages.py). They read the
engine, settings, store and metrics from `app.state` through the dependencies of
webui/api/deps.py, so `include_api` needs an app whose state holds them (webui/server.py's
build_app sets it). Unknown /v1 paths get a 404 in OpenAI's shape from a catch-all that is
included after every other router, `extra` ones too: a catch-all included earlier would
answer their paths first. It also keeps the page, mounted at "/" after the routes, from
answering /v1 paths. Routing runs on the server's event loop. No MLX.
"""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import APIRouter, FastAPI, Request
from fastapi.routing import APIRoute
from starlette.routing import Match

from radixchat.webui.api import chat, messages, models, responses
from radixchat.webui.api.errors import ApiError

OPENAI_ROUTERS = (models.router, chat.router, responses.router, messages.router)

unknown_router = APIRouter(prefix="/v1", include_in_schema=False)


# OpenAI's endpoints this server does not have: a client that tries one is told so plainly
NOT_SERVED = (
    "embeddings",
    "images",
    "audio",
    "files",
    "uploads",
    "batches",
    "moderations",
    "fine_tuning",
    "assistants",
    "threads",
    "vector_stores",
    "realtime",
)
SERVED = "/v1/chat/completions, /v1/completions, /v1/responses, /v1/messages and /v1/models"


@unknown_router.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
def unknown(request: Request, path: str) -> None:  # it only raises (NoReturn would be read as a response model)
    for route in (r for router in OPENAI_ROUTERS for r in router.routes):  # one of ours, by another method
        if isinstance(route, APIRoute) and route.matches(request.scope)[0] == Match.PARTIAL:
            allowed = ", ".join(sorted(route.methods or ()))
            message = f"/v1/{path} takes {allowed}, not {request.method}"
            raise ApiError(405, message, "invalid_request_error", "method_not_allowed", headers={"Allow": allowed})
    if path.split("/")[0] in NOT_SERVED:
        message = f"/v1/{path.split('/')[0]} is not served by this server (it serves {SERVED})"
        raise ApiError(404, message, "invalid_request_error", "not_served")
    raise ApiError(404, f"unknown route /v1/{path}", "invalid_request_error", "not_found")


def include_api(app: FastAPI, extra: Iterable[APIRouter] = ()) -> None:
    """The OpenAI routers, then `extra`, then the catch-all for unknown /v1 paths, last."""
    for router in (*OPENAI_ROUTERS, *extra):
        app.include_router(router)
    app.include_router(unknown_router)
