"""OpenAI's Responses API (`POST /v1/responses`, `GET /v1/responses/{id}`) over the same
engine, with `previous_response_id` kept in the store as the user's conversations.

Current OpenAI SDKs and agent frameworks default to this API. What is served: text input
(a string, or messages whose content is text or input_text parts), `instructions` (the
system message of this turn), streaming (the event sequence the SDK reads:
response.created ... output_text.delta ... response.completed, or response.incomplete for a
reply cut by it), `max_output_tokens`,
`temperature`, `top_p`, `text.format` (json_object / json_schema through the same
constrained decoding as chat), function `tools` and `tool_choice` (as chat's: the same
template tools, forcing grammar and parsing, webui/api/toolcalls.py; calls are
`function_call` output items, and come back as input items with their
`function_call_output`), and `previous_response_id`. Everything else that would change the
reply (hosted tools, reasoning, images) is refused with a 400 that names it. A turn that
carries calls, or offers tools, is not kept (the store holds text turns). The
request and reply shapes are webui/api/shapes/responses_shapes.py's; submitting, waiting and
streaming are webui/api/generation.py's, as for chat.

With `store` (the default) and a signed-in key, each response is two messages of a
conversation of that user (the input, then the reply), so the page shows it too. Every id
a client sees is random (`resp_` and 48 hex digits; its output message's id is derived from
it), so ids say nothing of how many conversations or messages the server holds; the store
maps a kept one to its turn (core.store.response_ids). A previous id continues its
conversation; another user's id, or one that does not exist, is "not found", the same
answer. Continuing from an earlier response than the last starts a new conversation with
the history up to it (the old one is left as it was). `GET` reads a kept response back
from the branch of its conversation in view: its text, as "completed" (the usage and the
previous id are not kept: null). With --no-auth there is no user to keep them under:
`previous_response_id` is refused and `GET` finds nothing.
Routes run on the server's event loop; the store is called in worker threads.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from radixchat.core.seam.requests import ChatRequest, Sampling
from radixchat.core.store import Store
from radixchat.core.store.types import Message, StoreError, User
from radixchat.webui.api import generation, toolcalls
from radixchat.webui.api.deps import EnginesDep, MetricsDep, StoreDep, UserDep, charged_to, engine_for, watch_of
from radixchat.webui.api.errors import ApiError, invalid
from radixchat.webui.api.generation import CLIENT_GONE, Ledger
from radixchat.webui.api.shapes.responses_shapes import ResponseEvents, ResponsesRequest, ended, response_object

router = APIRouter(prefix="/v1", tags=["responses"])

# what any id this API made looks like (the random ones, and the older kind that named the
# conversation and message); anything else is unknown without asking the store
ID = re.compile(r"^resp_[0-9a-z_]{1,64}$")
ONLY_KEPT = "responses are only kept with store for signed-in users, and without tools"


@router.post("/responses")
async def create_response(
    request: Request, body: ResponsesRequest, user: UserDep, engines: EnginesDep, store: StoreDep, metrics: MetricsDep
) -> Response:
    engine = await engine_for(engines, body.model)
    turn = _turn(body)
    family = engine.info.tool_format if body.calls_tools() else None
    try:
        tools, lark = body.tool_side(family)
    except toolcalls.ToolsUnsupported as e:
        raise ApiError(400, str(e), code="tools_unsupported", param="tools") from None
    except ValueError as e:
        raise invalid(e) from None
    # the store keeps text turns: one that carries calls or their outputs, or offers tools (its
    # reply may be calls), is answered, not kept
    carries_calls = any(m["role"] == "tool" or m.get("tool_calls") for m in turn) or bool(body.tools)
    if carries_calls and body.previous_response_id:
        raise ApiError(
            400,
            "input: function_call and function_call_output items go with the whole conversation as input,"
            " not with previous_response_id (kept responses hold text only)",
            param="previous_response_id",
        )
    keep = body.store and store is not None and user is not None and not carries_calls
    conv: int | None = None
    history: list[dict[str, Any]] = []
    if body.previous_response_id:
        if user is None or store is None:
            raise ApiError(
                400,
                "previous_response_id: responses are kept per signed-in user, and with --no-auth there is none",
                param="previous_response_id",
            )
        conv, history = await asyncio.to_thread(continue_from, store, user, body.previous_response_id)
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    fields = {**body.sampling(engine.info.sampling_defaults), "lark": lark}
    model = engine.info.model_id
    ledger = Ledger(metrics, store, model, user, "responses", watch=watch_of(request, user))
    handle = await generation.submit(
        ledger,
        lambda: engine.asubmit(
            ChatRequest(
                messages=system + history + turn,
                tools=tools,
                sampling=Sampling(**fields),
                **charged_to(user),
            )
        ),
    )
    rid, previous = new_response_id(), body.previous_response_id
    created = time.time()  # (as a kept turn's, read back later, says: its input is kept now)
    if keep:
        assert store is not None and user is not None  # what `keep` needs
        try:
            conv = await asyncio.to_thread(start_turn, store, user, conv, turn, rid)
        except StoreError as e:
            handle.cancel()
            raise ApiError(400, f"input: {e}") from None

    async def keep_reply(text: str) -> None:
        if keep and store is not None and user is not None and conv is not None:
            await asyncio.to_thread(store.append_message, user, conv, "assistant", text)

    if body.stream:
        events = ResponseEvents(
            rid, model, previous, keep_reply, output_id(rid), family, body.forced(), body.echoed(), created
        )
        return generation.stream([handle], events, ledger)
    (final,), gone = await generation.wait_for_ends(request, [handle], ledger)
    await keep_reply(final.text)  # kept even when the client left: the page shows it
    if gone:
        return Response(status_code=CLIENT_GONE)
    content, calls, _ = toolcalls.reply(family, final.text, body.forced())
    status, why = ended(final)
    return JSONResponse(
        response_object(
            rid, model, content or "", status, final.usage, previous, output_id(rid), created, calls, why, body.echoed()
        )
    )


@router.get("/responses/{response_id}")
async def get_response(response_id: str, user: UserDep, engines: EnginesDep, store: StoreDep) -> JSONResponse:
    if user is None or store is None:
        raise ApiError(
            404, f"response {response_id!r} not found: {ONLY_KEPT}, and with --no-auth there is none", code="not_found"
        )
    return JSONResponse(await asyncio.to_thread(kept_response, store, user, response_id, engines.default.info.model_id))


def _turn(body: ResponsesRequest) -> list[dict[str, Any]]:
    """This turn's input as chat messages; a bad input or format is this route's 400."""
    try:
        turn = body.messages()
        body.reply_schema()
    except ValueError as e:
        raise invalid(e) from None
    if not turn or turn[-1]["role"] not in ("user", "tool"):
        raise ApiError(400, "input: the last item must be the user's message or a function_call_output", param="input")
    return turn


def new_response_id() -> str:
    """A new response's id: random (192 bits), whether it is kept or not."""
    return f"resp_{secrets.token_hex(24)}"


def output_id(rid: str) -> str:
    """The id of a response's output message: as random as the response's, and the same
    when the response is read back."""
    return "msg_" + rid.removeprefix("resp_")


def _find(store: Store, user: User, response_id: str, gone: ApiError) -> tuple[int, list[Message], int]:
    """(conversation, its branch in view, the index of the user message the id names), or
    `gone`: another user's id and an unknown one get the same answer. Store thread."""
    if not ID.match(response_id):
        raise gone
    try:
        conv, msg = store.named_turn(user, response_id)
        history = store.history(user, conv)
    except StoreError:
        raise gone from None
    at = next((i for i, m in enumerate(history) if m.id == msg and m.role == "user"), None)
    if at is None:
        raise gone
    return conv, history, at


def _reply_after(history: list[Message], at: int) -> Message | None:
    after = history[at + 1] if at + 1 < len(history) else None
    return after if after is not None and after.role == "assistant" else None


def continue_from(store: Store, user: User, response_id: str) -> tuple[int, list[dict[str, Any]]]:
    """(the conversation to go on in, its messages up to and with that response's reply);
    store thread. Another user's id and an unknown one get the same 404."""
    gone = ApiError(404, f"response {response_id!r} not found", code="not_found", param="previous_response_id")
    conv, history, at = _find(store, user, response_id, gone)
    end = at + 1 + (_reply_after(history, at) is not None)
    kept = [{"role": m.role, "content": m.content} for m in history[:end]]
    if end < len(history):  # it went on after that response: branch, leaving it as it was
        conv = store.create_conversation(user, store.get_conversation(user, conv).title).id
        for m in kept:
            store.append_message(user, conv, m["role"], m["content"])
    return conv, kept


def kept_response(store: Store, user: User, response_id: str, model: str) -> dict[str, Any]:
    """The Response object of a kept response, read back from the store; store thread.
    A turn with no reply kept (its stream was cut off, or it is still running) is
    "incomplete", with no output."""
    gone = ApiError(404, f"response {response_id!r} not found; {ONLY_KEPT}", code="not_found")
    _, history, at = _find(store, user, response_id, gone)
    reply = _reply_after(history, at)
    asked = history[at]
    out = output_id(response_id)
    if reply is None:
        body = response_object(response_id, model, "", "incomplete", None, None, out, asked.created)
        return {**body, "output": []}
    return response_object(response_id, model, reply.content, "completed", None, None, out, asked.created)


def start_turn(store: Store, user: User, conv: int | None, turn: list[dict[str, Any]], rid: str) -> int:
    """Keep this turn's input in the user's conversation (a new one without `conv`), its last
    message named `rid`; the conversation. Store thread."""
    if conv is None:
        title = next((m["content"] for m in turn if m["role"] == "user"), "Response")[:60].strip() or "Response"
        conv = store.create_conversation(user, title).id
    last = None
    for m in turn:
        if m["role"] in ("user", "assistant"):
            last = store.append_message(user, conv, m["role"], m["content"])
    if last is None:  # `_turn` ends every kept turn with the user's message
        raise ApiError(400, "input: no message of the user's to keep", param="input")
    store.name_turn(user, conv, last.id, rid)
    return conv
