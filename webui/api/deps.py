"""FastAPI dependencies of the API routes: the app's shared state and the current user.

The served models (their engines), settings, store and metrics are the app's
(`request.app.state`, set once by webui/server.py's build_app), so the routers are plain module-level APIRouters that any app
holding that state can include. The current user comes from the request's API key
(`Authorization: Bearer KEY`, or `x-api-key: KEY`); with --no-auth there is none (None). A
key marked as a trusted front end's (`radixchat keys create NAME --front-end`) may name the
request's end user (`X-Radixchat-User`, or Open WebUI's `X-OpenWebUI-User-Id`): the request
is then that end user's, a user of its own named FRONT/USER, made on first sight, with their
own limits, fair share, cache scope and rows; any other key's such headers are ignored.
A route takes what it needs by annotation (`engines: EnginesDep`, `user: UserDep`); FastAPI
solves each once per request. The state getters are coroutines so that they run on the
event loop (a sync dependency costs a worker-thread hop); `current_user` is sync because
checking a key reads SQLite, so FastAPI runs it in a worker thread. No MLX here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any

from fastapi import Depends, Request

# imported for real, not under TYPE_CHECKING: FastAPI reads the annotations at start-up
from radixchat.core.config import Settings
from radixchat.core.seam.handle import RequestHandle
from radixchat.core.seam.protocol import EngineClient, Engines
from radixchat.core.seam.requests import RequestError, owner_of
from radixchat.core.store import Store
from radixchat.core.store.auth import api_key_hash
from radixchat.core.store.types import AuthFailed, Invalid, User
from radixchat.webui.api.errors import ANTHROPIC_PATHS, ApiError
from radixchat.webui.api.metrics import Metrics


# app.state is untyped: each getter names the type of what build_app put there
async def get_engines(request: Request) -> Engines:
    engines: Engines = request.app.state.engines
    return engines


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_store(request: Request) -> Store | None:
    store: Store | None = request.app.state.store
    return store


async def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


EnginesDep = Annotated[Engines, Depends(get_engines)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store | None, Depends(get_store)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]


def current_user(request: Request, settings: SettingsDep, store: StoreDep) -> User | None:
    """The key's user (None with --no-auth); kept on the request too, for a refusal's row."""
    user = _key_user(request, settings, store)
    request.state.user = user
    return user


def _key_user(request: Request, settings: Settings, store: Store | None) -> User | None:
    if settings.no_auth:
        return None
    if store is None:  # a server with sign-in has a store (webui/cli/main.py)
        raise ApiError(503, "the server has no store of users", "server_error", "no_store")
    scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
    key = bearer.strip() if scheme.lower() == "bearer" else ""
    key = key or request.headers.get("x-api-key", "").strip()
    if not key:  # told in the header its own API's clients send
        how = "x-api-key: <key>" if request.url.path.startswith(ANTHROPIC_PATHS) else "Authorization: Bearer <key>"
        raise ApiError(401, f"missing API key: send '{how}'", "authentication_error", "missing_api_key")
    try:
        user, front_end = store.api_key_holder(key)
    except AuthFailed:
        # the type is what clients map: litellm reads invalid_request_error as a bad request
        raise ApiError(401, "invalid or revoked API key", "authentication_error", "invalid_api_key") from None
    request.state.front_end = front_end  # its end users are clients of their own (webui/api/refusals.py)
    request.state.key_hash = api_key_hash(key)  # what it runs stops if the key is revoked (`watch_of`)
    header, end = end_user_header_named(request.headers)
    if not (front_end and end):  # an ordinary key's headers name nobody: it is its owner's
        return user
    try:
        return store.end_user(user, end)
    except Invalid as e:
        raise ApiError(400, f"{header}: {e}", param=header) from None


# who a trusted front end's request is for: radixchat's own header, then Open WebUI's (sent
# with ENABLE_FORWARD_USER_INFO_HEADERS=true)
END_USER_HEADERS = ("x-radixchat-user", "x-openwebui-user-id")


def end_user_header(headers: Mapping[str, str]) -> str:
    """The end user a request's headers name (a mapping with lower-case keys), "" for none."""
    return end_user_header_named(headers)[1]


def end_user_header_named(headers: Mapping[str, str]) -> tuple[str | None, str]:
    """(the header that names the end user, its value), or (None, "")."""
    return next(((h, headers[h].strip()) for h in END_USER_HEADERS if headers.get(h, "").strip()), (None, ""))


UserDep = Annotated[User | None, Depends(current_user)]


def owner_of_user(user: User | None) -> str | None:
    """The engine's `owner` of a request of `user` (None under --no-auth: the one local user)."""
    return owner_of(user.cache_key) if user is not None else None


def charged_to(user: User | None) -> dict[str, Any]:
    """A request's `owner` and `owner_limit` for `user`: whose share, cache scope and limit of
    requests in flight it counts against (the server's --max-user-requests where they have none)."""
    return {"owner": owner_of_user(user), "owner_limit": user.request_limit if user is not None else None}


def watch_of(request: Request, user: User | None) -> Callable[[RequestHandle], None] | None:
    """What notes an accepted request's handle under its user and key, so that it stops if
    either is cut off while it runs (webui/live_requests.py); None with --no-auth."""
    live = getattr(request.app.state, "live", None)
    if live is None or user is None:
        return None
    key_hash = getattr(request.state, "key_hash", None)
    return lambda handle: live.track(handle, user.id, key_hash)


async def engine_for(engines: Engines, name: str) -> EngineClient:
    """The engine of the model a request's `model` names (its id, or an alias such as
    `default`), loaded now if it is not: else OpenAI's 404 naming the served models, or a
    503 when it could not be loaded."""
    try:
        return await engines.aengine(name)
    except RequestError as e:
        type_ = "server_error" if e.status == 503 else "invalid_request_error"
        headers = {"Retry-After": "5"} if e.status == 503 else None
        raise ApiError(e.status, e.message, type_, e.code, param="model", headers=headers, model=name) from None
