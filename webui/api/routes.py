"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models.

Each request is authenticated with a bearer key from the store (unless the server runs
with --no-auth), turned into an engine request, streamed back as server-sent events or
returned whole, and logged in SQLite under the key's user. A client that goes away
cancels its request in the engine, streaming or not: a stream notices when Starlette's
response does; a whole reply has a watcher on the connection while it waits (issue 14,
item 4: without one, clients that hung up kept their work running and their user's share
of --max-user-requests taken). Errors use OpenAI's error shape (see webui/api/errors.py).

Each accepted request's end (metrics, its row) is recorded once by a RequestEnd
(webui/request_end.py) hooked on the handle at submit, whether or not the client stays to
read it; the row goes through the store's queued writer, so the engine thread that ends the
request never waits for SQLite. Routes and the disconnect watchers run on the event loop,
`current_user` in FastAPI's worker threads. No MLX here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from radixchat.core.engine.requests import (
    SEED_MAX,
    ChatRequest,
    Failed,
    Finished,
    PromptRequest,
    RequestError,
    Sampling,
    TextDelta,
    owner_of,
)
from radixchat.core.store.types import AuthFailed, RequestRecord, StoreError, User
from radixchat.webui.api import responses as rs
from radixchat.webui.api import schema as oa
from radixchat.webui.api import toolcalls
from radixchat.webui.api.errors import ApiError
from radixchat.webui.request_end import RequestEnd

if TYPE_CHECKING:
    from radixchat.core.config import Settings
    from radixchat.core.engine.handle import RequestHandle
    from radixchat.core.engine.seam import EngineClient
    from radixchat.core.store import Store
    from radixchat.webui.api.metrics import Metrics

log = logging.getLogger("radixchat.api")
ALIASES = {"default", "default_model"}
CLIENT_GONE = 499  # nginx's "client closed request"; never sent, the connection is gone


async def last_event(handle: RequestHandle):
    async for ev in handle:  # noqa: B007
        pass
    return ev


async def wait_for_ends(request: Request, handles: list[RequestHandle]) -> tuple[list, bool]:
    """(every handle's final event, whether the client left meanwhile: then the requests were
    cancelled), for a reply sent whole at the end; a failed request is the reply's 500."""
    watcher = asyncio.create_task(cancel_when_gone(request, handles))
    try:  # each final event carries its request's whole text
        finals = await asyncio.gather(*(last_event(h) for h in handles))
    finally:
        watcher.cancel()
        for h in handles:
            h.cancel()  # no-op once finished; frees the slot if this task was cancelled
    failed = next((ev for ev in finals if isinstance(ev, Failed)), None)
    if failed is not None:
        raise ApiError(500, f"generation failed: {failed.message}", "server_error", "engine_error")
    return finals, watcher.done() and not watcher.cancelled() and watcher.result()


async def cancel_when_gone(request: Request, handles: list[RequestHandle]) -> bool:
    """Cancel `handles` once the client disconnects, and say so (True). Run it as a task
    beside a reader that sends nothing until the end (a whole reply), and cancel it when
    the reader is done.

    The body is read by then, so the next ASGI message is `http.disconnect`, and waiting on
    `receive` wakes the moment the server sees the close (polling `is_disconnected()` would
    leave each gone request running for up to a poll period). Only one task may wait on
    `receive`: never beside a StreamingResponse, which has its own."""
    try:
        while (await request.receive())["type"] != "http.disconnect":
            # anything else breaks the ASGI contract (the body is done); a server that
            # answers at once would make this spin, so it becomes a slow poll instead
            await asyncio.sleep(0.5)
    except Exception:  # a server that can't say: the request just runs to its end
        log.debug("cannot watch the connection for a disconnect", exc_info=True)
        return False
    for handle in handles:
        handle.cancel()
    return True


def openai_router(engine: EngineClient, settings: Settings, store: Store | None, metrics: Metrics) -> APIRouter:
    router = APIRouter(prefix="/v1")
    model_id = engine.info.model_id

    def current_user(request: Request) -> User | None:
        """The key's user (None with --no-auth). Sync: FastAPI runs it off the event loop."""
        if settings.no_auth:
            return None
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise ApiError(
                401, "missing API key: send 'Authorization: Bearer <key>'", "authentication_error", "missing_api_key"
            )
        try:
            return store.verify_api_key(key.strip())
        except AuthFailed:
            # the type is what clients map: litellm reads invalid_request_error as a bad request
            raise ApiError(401, "invalid or revoked API key", "authentication_error", "invalid_api_key") from None

    # what the model's card recommends, for requests that leave temperature or top_p out
    recommended = engine.info.sampling_defaults

    def check_model(name: str) -> None:
        if name != model_id and name not in ALIASES:
            raise ApiError(
                404,
                f"model {name!r} not found; this server serves {model_id!r}",
                "invalid_request_error",
                "model_not_found",
                param="model",
            )

    async def submit(user: User | None, build: Callable[[], Awaitable[RequestHandle]]) -> RequestHandle:
        try:
            handle = await build()
        except ValidationError as e:
            first = e.errors()[0]
            err = ApiError(400, f"{'.'.join(map(str, first['loc']))}: {first['msg']}")
        except RequestError as e:
            headers = {"Retry-After": "2"} if e.status in (429, 503) else None
            # OpenAI's statuses and types, which clients map to their exceptions: an overflow
            # is a 400 (litellm: ContextWindowExceededError), a busy server a 429 "requests"
            status = 400 if e.code == "context_length_exceeded" else e.status
            type_ = {429: "requests", 503: "server_error"}.get(status, "invalid_request_error")
            err = ApiError(status, e.message, type_, e.code, headers=headers)
        else:
            # hooked before anything is awaited: the end is recorded even if the client
            # leaves before its response starts
            RequestEnd(handle, metrics, lambda final, _text: record(user, final))
            return handle
        log_request(user, error=f"{err.status}: {err.message}")
        raise err  # counted on /metrics by the error handler, with the others refused

    async def submit_choices(user: User | None, body, build) -> list[RequestHandle]:
        """One engine request per choice (n), submitted together: the engine computes their
        shared prompt once (a request waits for another prefilling its prefix) and they
        decode side by side. With a seed, choice i samples with seed + i, so the choices
        differ and the same request gives the same choices again."""
        handles: list[RequestHandle] = []
        for i in range(body.n):
            fields = body.sampling(recommended)
            if fields["seed"] is not None and i:
                fields["seed"] = (fields["seed"] + i) if fields["seed"] + i <= SEED_MAX else fields["seed"] - i
            try:  # the sampling is checked inside submit: a bad value is its 400
                handles.append(await submit(user, lambda: build(Sampling(**fields))))  # noqa: B023
            except BaseException:
                for h in handles:  # all choices or none
                    h.cancel()
                raise
        return handles

    def record(user: User | None, final: Finished | Failed) -> None:
        u = final.usage
        log_request(
            user,
            prompt_tokens=u.prompt_tokens,
            cached_tokens=u.cached_tokens,
            generated_tokens=u.generated_tokens,
            queue_ms=u.queue_ms,
            ttft_ms=u.ttft_ms,
            total_ms=u.total_ms,
            decode_tps=u.decode_tps,
            finish_reason=getattr(final, "finish_reason", None),
            error=getattr(final, "message", None),
        )

    def log_request(user: User | None, **fields) -> None:
        """Every API request, refused or served, gets a row under the key's user."""
        if store is None:
            return
        try:
            store.record_request_async(RequestRecord(user=user.id if user else None, model=model_id, **fields))
        except Exception:  # bookkeeping must never break a reply
            log.exception("could not record request metrics")

    async def respond(
        request: Request,
        handles: list[RequestHandle],
        stream: bool,
        include_usage: bool,
        chat: bool,
        echo: str = "",
        tool_family: str | None = None,
    ):
        """The reply of one request: `handles` are its n choices (one engine request each);
        `echo` starts every choice's text (completions' echo); with `tool_family`, calls in
        the text become tool_calls (webui/api/toolcalls.py)."""
        rid = oa.new_id("chatcmpl" if chat else "cmpl")
        if not stream:
            finals, gone = await wait_for_ends(request, handles)
            if gone:
                # the client left and the request was cancelled: its rows say so (RequestEnd),
                # and there is nobody to send a body to
                return Response(status_code=CLIENT_GONE)
            usage = oa.usage_of_choices([ev.usage for ev in finals])
            if chat:
                choices = []
                for i, ev in enumerate(finals):
                    content, calls, called = toolcalls.reply(tool_family, ev.text)
                    choices.append(
                        oa.ChatChoice(
                            index=i,
                            message=oa.ChoiceMessage(content=content, tool_calls=calls),
                            finish_reason="tool_calls" if called else ev.finish_reason,
                            logprobs=oa.chat_logprobs(ev.logprobs),
                        )
                    )
                body = oa.ChatCompletion(id=rid, model=model_id, usage=usage, choices=choices)
            else:
                body = oa.Completion(
                    id=rid,
                    model=model_id,
                    usage=usage,
                    choices=[
                        oa.TextChoice(
                            index=i,
                            text=echo + ev.text,
                            finish_reason=ev.finish_reason,
                            logprobs=oa.completion_logprobs(ev.logprobs),
                        )
                        for i, ev in enumerate(finals)
                    ],
                )
            return JSONResponse(body.model_dump())

        sent = [0] * len(handles)  # characters streamed so far per choice (legacy text_offset)

        streams = [toolcalls.Stream(tool_family) for _ in handles] if tool_family else None

        def chunk(
            i=0, content=None, finish=None, role=None, usage=None, choices=True, logprobs=None, calls=None
        ) -> str:
            if chat:
                c = oa.ChatCompletionChunk(
                    id=rid,
                    model=model_id,
                    usage=usage,
                    choices=[
                        oa.ChunkChoice(
                            index=i,
                            delta=oa.Delta(role=role, content=content, tool_calls=calls),
                            finish_reason=finish,
                            logprobs=oa.chat_logprobs(logprobs),
                        )
                    ]
                    if choices
                    else [],
                )
            else:
                c = oa.Completion(
                    id=rid,
                    model=model_id,
                    usage=usage,
                    choices=[
                        oa.TextChoice(
                            index=i,
                            text=content or "",
                            finish_reason=finish,
                            logprobs=oa.completion_logprobs(logprobs, sent[i]),
                        )
                    ]
                    if choices
                    else [],
                )
            return f"data: {c.model_dump_json(exclude=None if usage else {'usage'})}\n\n"

        async def events():
            finals: dict[int, object] = {}
            merged: asyncio.Queue = asyncio.Queue()

            async def pump(i: int, h: RequestHandle):
                async for ev in h.batched():  # a client that fell behind gets what is there in one event
                    merged.put_nowait((i, ev))

            pumps = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
            try:
                for i in range(len(handles)):
                    if chat:
                        yield chunk(i, role="assistant", content="")
                    elif echo:
                        yield chunk(i, content=echo)
                while len(finals) < len(handles):
                    i, ev = await merged.get()
                    if isinstance(ev, TextDelta):
                        text = streams[i].feed(ev.text) if streams else ev.text
                        if text or not streams:
                            yield chunk(i, content=text, logprobs=ev.logprobs)
                        sent[i] += len(text)
                    elif isinstance(ev, Failed):
                        finals[i] = ev
                        yield f"data: {oa.ErrorResponse(error=oa.ErrorBody(message=ev.message, type='server_error')).model_dump_json()}\n\n"
                        break
                    else:
                        finals[i] = ev
                        finish = ev.finish_reason
                        if streams:
                            rest, calls = streams[i].finish()
                            if rest:
                                yield chunk(i, content=rest)
                            if calls:
                                yield chunk(i, calls=calls)
                                finish = "tool_calls"
                        yield chunk(i, finish=finish)
                if (
                    include_usage
                    and len(finals) == len(handles)
                    and not any(isinstance(ev, Failed) for ev in finals.values())
                ):
                    yield chunk(
                        usage=oa.usage_of_choices([finals[i].usage for i in range(len(handles))]), choices=False
                    )
                yield "data: [DONE]\n\n"
            finally:
                for task in pumps:
                    task.cancel()
                for i, h in enumerate(handles):
                    if i not in finals:  # the client went away, or a sibling failed: stop generating
                        h.cancel()

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )

    @router.get("/models")
    def models(user=Depends(current_user)):
        card = oa.ModelCard(id=model_id, created=engine.info.created)
        return oa.ModelList(data=[card]).model_dump()

    @router.get("/models/{name:path}")
    def model(name: str, user=Depends(current_user)):
        check_model(name)  # the aliases answer with the served model's card, as a request would use it
        return oa.ModelCard(id=model_id, created=int(engine.started_at)).model_dump()

    @router.post("/chat/completions")
    async def chat_completions(request: Request, body: oa.ChatCompletionRequest, user=Depends(current_user)):
        check_model(body.model)
        family = engine.info.tool_format if body.calls_tools() else None
        try:
            tools, lark = toolcalls.request_side(body, family)
        except toolcalls.ToolsUnsupported as e:
            raise ApiError(400, str(e), code="tools_unsupported", param="tools") from None
        messages = [m.for_template() for m in body.messages]
        handles = await submit_choices(
            user,
            body,
            lambda sampling: engine.asubmit(
                ChatRequest(
                    messages=messages,
                    tools=tools,
                    sampling=sampling.model_copy(update={"lark": lark}),
                    owner=owner_of(user and user.id),
                )
            ),
        )
        include = bool(body.stream_options and body.stream_options.include_usage)
        return await respond(request, handles, body.stream, include, chat=True, tool_family=family if tools else None)

    @router.post("/completions")
    async def completions(request: Request, body: oa.CompletionRequest, user=Depends(current_user)):
        check_model(body.model)
        handles = await submit_choices(
            user,
            body,
            lambda sampling: engine.asubmit(
                PromptRequest(prompt=body.prompt, sampling=sampling, owner=owner_of(user and user.id))
            ),
        )
        include = bool(body.stream_options and body.stream_options.include_usage)
        return await respond(request, handles, body.stream, include, chat=False, echo=body.prompt if body.echo else "")

    @router.post("/responses")
    async def responses(request: Request, body: rs.ResponsesRequest, user=Depends(current_user)):
        check_model(body.model)
        try:  # checked here, where a bad input or format is this route's 400
            turn = body.messages()
            body.schema()
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        if not turn or turn[-1]["role"] != "user":
            raise ApiError(400, "input: the last message must come from the user", param="input")
        keep = body.store and store is not None and user is not None
        conv, history = None, []
        if body.previous_response_id:
            if user is None or store is None:
                raise ApiError(
                    400,
                    "previous_response_id: responses are kept per signed-in user, and with --no-auth there is none",
                    param="previous_response_id",
                )
            conv, history = await asyncio.to_thread(rs.continue_from, store, user, body.previous_response_id)
        system = [{"role": "system", "content": body.instructions}] if body.instructions else []
        handle = await submit(
            user,
            lambda: engine.asubmit(
                ChatRequest(
                    messages=system + history + turn,
                    sampling=Sampling(**body.sampling(recommended)),
                    owner=owner_of(user and user.id),
                )
            ),
        )
        rid, previous = rs.new_id("resp"), body.previous_response_id
        if keep:
            try:
                conv, msg = await asyncio.to_thread(rs.start_turn, store, user, conv, turn)
            except StoreError as e:
                handle.cancel()
                raise ApiError(400, f"input: {e}") from None
            rid = f"resp_{conv}_{msg}"

        async def keep_reply(text: str) -> None:
            if keep:
                await asyncio.to_thread(store.append_message, user, conv, "assistant", text)

        if not body.stream:
            (final,), _ = await wait_for_ends(request, [handle])
            await keep_reply(final.text)
            status = "completed" if final.finish_reason != "cancelled" else "incomplete"
            return JSONResponse(
                rs.response_object(
                    rid, model_id, final.text, status, final.usage, previous, rs.new_id("msg"), time.time()
                )
            )

        events = rs.Events(rid, model_id, previous)

        async def stream():
            final = None
            try:
                for e in events.start():
                    yield e
                async for ev in handle.batched():
                    if isinstance(ev, TextDelta):
                        yield events.delta(ev.text)
                    else:
                        final = ev
                if isinstance(final, Failed):
                    yield events.failed(final.message)
                    return
                await keep_reply(final.text)
                for e in events.end(rid, final.text, final.usage):
                    yield e
            finally:
                if final is None:
                    handle.cancel()

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )

    @router.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"], include_in_schema=False)
    def unknown(path: str):
        raise ApiError(404, f"unknown route /v1/{path}", "invalid_request_error", "not_found")

    return router
