"""Errors in OpenAI's shape (Anthropic's under /v1/messages), and the request-body size limit.

Every failure an API client can meet becomes `{"error": {"message", "type", "param",
"code"}}` with the right status: 400 malformed or invalid, 401 auth, 404 unknown model or
route, 413 too large, 429/503 with Retry-After when busy. Bad input is never a 500.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixchat.core.seam.requests import RequestError
from radixchat.webui.api import rows

log = logging.getLogger("radixchat.api")

# the request's checks start a message with the field it is about ("tool_choice: ...")
_NAMED = re.compile(r"([A-Za-z_]\w*(?:\.\w+)*): ")


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        model: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param
        self.headers, self.model = headers, model  # model: the one it was for, for its row


def invalid(e: ValueError, otherwise: str | None = None) -> ApiError:
    """A request's check that failed outside pydantic, as its 400: the field its message
    names first ("input: ...", see `_NAMED`) is the param, else `otherwise`."""
    code = e.code if isinstance(e, RequestError) else "invalid_value"  # (one that names its kind)
    return ApiError(400, str(e), code=code, param=named_field(str(e)) or otherwise)


def named_field(message: str) -> str | None:
    """The field a check's message starts with ("response_format: ..."), if it names one."""
    named = _NAMED.match(message)
    return named[1] if named else None


def error_response(
    status: int,
    message: str,
    type_: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
    path: str = "",
) -> JSONResponse:
    """The error in OpenAI's shape; under /v1/messages (Anthropic's API), in Anthropic's."""
    return JSONResponse(error_body(status, message, type_, code, param, path), status_code=status, headers=headers)


def error_body(status: int, message: str, type_: str, code: str | None, param: str | None, path: str) -> dict[str, Any]:
    """`error_response`'s body, for middleware too (`send_error`)."""
    if path.startswith(ANTHROPIC_PATHS):
        return {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


ANTHROPIC_PATHS = ("/v1/messages",)
# Anthropic's error types by status (what its SDK maps to its exceptions)
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def _in_body(loc: tuple[int | str, ...], body: Any, kind: str) -> list[str]:
    """The error's place as a path into the body the client sent. pydantic's place also names
    the branch of a union it tried (`str`, `list[tagged-union[...]]`) and a tagged union's tag
    (`tool_use`): those name nothing the client wrote, so they are left out. A missing field's
    name is kept though the body lacks it."""
    path: list[str] = []
    here = body
    for i, p in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(here, dict) and isinstance(p, str) and p in here:
            if not last and here.get("type") == p and isinstance(loc[i + 1], str):
                continue  # a tag that is also a key: {"type": "text", "text": ...}
            path.append(p)
            here = here[p]
        elif isinstance(here, list) and isinstance(p, int) and 0 <= p < len(here):
            path.append(str(p))
            here = here[p]
        elif last and kind == "missing":
            path.append(str(p))
    return path


def _first_error(errs: list[dict[str, Any]], body: Any) -> tuple[dict[str, Any], list[str]]:
    """The error to report: the first, except a union's branch whose type did not match where
    another branch got further (content as a list of blocks is not 'not a string')."""
    placed = [(e, _in_body(tuple(p for p in e.get("loc", ()) if p != "body"), body, e.get("type", ""))) for e in errs]
    for e, path in placed:
        branch_miss = e.get("type", "").endswith("_type")
        if not (branch_miss and any(len(q) > len(path) and q[: len(path)] == path for _, q in placed)):
            return e, path
    return placed[0]


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errs = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errs):
        return "the request body is not valid JSON", None
    body = getattr(exc, "body", None)
    if body is None:
        e = errs[0]
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
    else:
        e, loc = _first_error(list(errs), body)
    param = ".".join(loc) or None
    if param is None and e.get("type") in ("model_attributes_type", "dict_type"):
        return "the request body must be a JSON object", None
    if e.get("type") == "missing":
        if param is None:  # no body at all (FastAPI's "missing" for the whole of it)
            return "the request body is empty: send a JSON object", None
        return f"missing required field: {param}", param
    msg = e.get("msg", "invalid value").removeprefix("Value error, ")
    # a validator's message starts with the field it is about ("tool_choice: ..."): a field
    # below the place pydantic names (none, for a check of the whole body), so it is the param
    named = _NAMED.match(msg) if e.get("type") == "value_error" else None
    if named:
        # named from the top ("tools.0" for a check of `tools`), or from where pydantic is
        top = ".".join(loc)
        param = named[1] if not top or named[1] == top or named[1].startswith(top + ".") else f"{top}.{named[1]}"
        msg = msg[named.end() :]
    return (f"{param}: {msg}" if param else msg), param


def count_refusal(app: Starlette, path: str, reason: str) -> None:
    """An API request refused before it generated: counted by reason on /metrics (if the
    app has them; the page counts its own)."""
    metrics = getattr(app.state, "metrics", None)
    if metrics is not None and path.startswith("/v1/"):
        metrics.rejected(reason)


async def note_refusal(
    request: Request, status: int, reason: str, message: str, param: str | None = None, model: str | None = None
) -> None:
    """`count_refusal`, a line on the log saying what was wrong (the field, when one), and the
    request's row, committed before the answer goes."""
    path = request.url.path
    count_refusal(request.app, path, reason)
    if path.startswith("/v1/"):
        who = request.client.host if request.client else "-"
        where = f" param={param}" if param else ""
        log.info("refused %s %d %s%s from %s: %s", path, status, reason, where, who, message)
        await rows.committed([rows.refusal(request, status, reason, message, param, model)])


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        if exc.status < 500:
            await note_refusal(request, exc.status, exc.code or str(exc.status), exc.message, exc.param, exc.model)
        return error_response(exc.status, exc.message, exc.type, exc.code, exc.param, exc.headers, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        await note_refusal(request, 400, "invalid_value", message, param)
        return error_response(400, message, param=param, code="invalid_value", path=request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(exc.status_code)
        message = str(exc.detail)
        if exc.status_code == 400 and message == UNREAD:  # what json could not read at all
            message, code = "the request body is not valid JSON (UTF-8 text, not nested too deep)", "invalid_value"
        await note_refusal(request, exc.status_code, code or str(exc.status_code), message)
        return error_response(exc.status_code, message, code=code, path=request.url.path)


# FastAPI's words for a body the json module failed on other than by its syntax (bytes that
# are not UTF-8, nesting past Python's recursion): its own JSONDecodeError is a validation error
UNREAD = "There was an error parsing the body"


class BodyTooLarge(StarletteHTTPException):
    """A body counted past the limit as it came in (a chunked one has no Content-Length to
    refuse first). An HTTPException so that FastAPI, reading the body for a route, passes it
    on as it is rather than as its 400 "error parsing the body"; the handler answers 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body over {limit} bytes")


class BodyLimit:
    """ASGI middleware: refuse request bodies over `limit` bytes with 413 (API paths only)."""

    def __init__(self, app: ASGIApp, limit: int, prefixes: tuple[str, ...] = ("/v1/",)) -> None:
        self.app, self.limit, self.prefixes = app, limit, prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefixes):
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self._too_large(scope, send)
        seen = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge(self.limit)
            return msg

        async def tracking_send(msg: Message) -> None:
            nonlocal started
            started = started or msg["type"] == "http.response.start"
            await send(msg)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._too_large(scope, send)

    async def _too_large(self, scope: Scope, send: Send) -> None:
        if scope.get("app") is not None:
            count_refusal(scope["app"], scope["path"], "body_too_large")
        await send_error(send, 413, BodyTooLarge(self.limit).detail, code="body_too_large", path=scope["path"])


async def send_error(
    send: Send,
    status: int,
    message: str,
    type_: str = "invalid_request_error",
    code: str | None = None,
    headers: Iterable[tuple[bytes, bytes]] = (),
    path: str = "",
) -> None:
    """An error from ASGI middleware, where no route (and so no `error_response`) runs: in
    OpenAI's shape, or Anthropic's under its paths (`error_body`)."""
    body = json.dumps(error_body(status, message, type_, code, None, path)).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})
