"""`POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's Messages API, for the
clients that speak it (the anthropic SDK, Claude Code, litellm's `anthropic/` route).

A request becomes one engine request through the same path as the OpenAI routes
(webui/api/generation.py: the key's user, their limits and fair share, cache scoping, the
request's row and metrics); its shapes, both ways, are webui/api/shapes/messages_shapes.py's. Its
errors are in Anthropic's envelope (webui/api/errors.py answers paths under /v1/messages
so). A model name nothing is served under that starts with `claude-` (what Claude Code
sends unless told otherwise) means the first served model; any other unknown name is a 404.
Routes run on the server's event loop (the key is checked in a worker thread). No MLX.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from radixchat.core.seam.protocol import EngineClient, Engines
from radixchat.core.seam.requests import ChatRequest, RequestError, Sampling
from radixchat.webui.api import generation
from radixchat.webui.api.deps import EnginesDep, MetricsDep, StoreDep, UserDep, charged_to, engine_for, watch_of
from radixchat.webui.api.errors import ApiError, invalid
from radixchat.webui.api.generation import CLIENT_GONE, Ledger
from radixchat.webui.api.shapes.messages_shapes import MessageEvents, MessagesBody, MessagesRequest, message, new_id

log = logging.getLogger("radixchat.api")
router = APIRouter(prefix="/v1", tags=["messages"])


class CountTokensRequest(MessagesBody):  # a class of its own: its name in /openapi.json
    pass


async def _engine(engines: Engines, name: str) -> EngineClient:
    """The served model `name` names; an unknown `claude-*` name is the first model."""
    try:
        engines.find(name)
    except RequestError:
        if name.startswith("claude-"):
            return engines.default
    return await engine_for(engines, name)


def _prepared(
    body: MessagesBody, engine: EngineClient
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, str | None, str | None]:
    """(chat messages, tools, the forced call's grammar, the tool family for the reply)."""
    family = engine.info.tool_format if body.calls_tools() else None
    try:
        return body.chat_messages(), body.chat_tools(), body.grammar(family), family
    except ValueError as e:
        raise invalid(e, "messages") from None


@router.post("/messages")
async def create_message(
    request: Request, body: MessagesRequest, user: UserDep, engines: EnginesDep, store: StoreDep, metrics: MetricsDep
) -> Response:
    engine = await _engine(engines, body.model)
    messages, tools, grammar, family = _prepared(body, engine)
    fields = {**body.sampling(engine.info.sampling_defaults), "lark": grammar}
    model = engine.info.model_id
    ledger = Ledger(metrics, store, model, user, "messages", watch=watch_of(request, user))
    handle = await generation.submit(
        ledger,
        lambda: engine.asubmit(
            ChatRequest(
                messages=messages,
                tools=tools,
                sampling=Sampling(**fields),
                **charged_to(user),
                continue_final=body.prefilled(),
            )
        ),
    )
    mid = new_id("msg")
    if body.stream:
        return generation.stream(
            [handle], MessageEvents(mid, model, handle.prompt_tokens, family, grammar is not None), ledger
        )
    (final,), gone = await generation.wait_for_ends(request, [handle], ledger)
    return (
        Response(status_code=CLIENT_GONE)
        if gone
        else JSONResponse(message(mid, model, final, family, grammar is not None))
    )


# response_model=None: the reply is the dict as it is, not a model FastAPI would make of the annotation
@router.post("/messages/count_tokens", response_model=None)
async def count_tokens(
    request: Request, body: CountTokensRequest, user: UserDep, engines: EnginesDep
) -> Response | dict[str, int]:
    """A count is a request of its user's like any other: within their request limit, and
    stopped when its client hangs up (its templating waits in the preparation pool)."""
    engine = await _engine(engines, body.model)
    messages, tools, _, _ = _prepared(body, engine)
    asked = ChatRequest(
        messages=messages,
        tools=tools,
        **charged_to(user),
        continue_final=body.prefilled(),
    )
    try:
        n, gone = await generation.unless_gone(request, engine.count_tokens(asked))
    except RequestError as e:
        raise ApiError(e.status, e.message, code=e.code) from None
    if gone:
        return Response(status_code=CLIENT_GONE)
    assert n is not None  # not gone: the count's own result
    return {"input_tokens": n}
