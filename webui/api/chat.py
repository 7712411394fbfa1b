"""`POST /v1/chat/completions` and `POST /v1/completions`: a request body becomes n engine
requests (webui/api/generation.py submits, waits and streams them), the reply is sent whole
or as OpenAI's chunks. This module owns the bodies and chunks of these two APIs: tool calls
in the text become `tool_calls` (webui/api/toolcalls.py), completions' `echo` starts each
choice's text, logprobs are put in each API's form. Routes run on the server's event loop
(the current user is checked in a worker thread, webui/api/deps.py). No MLX.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from radixchat.core.seam.requests import ChatRequest, Failed, Finished, PromptRequest, TextDelta, TokenLogprob
from radixchat.webui.api import generation, toolcalls
from radixchat.webui.api.deps import EnginesDep, MetricsDep, StoreDep, UserDep, charged_to, engine_for, watch_of
from radixchat.webui.api.errors import ApiError, invalid
from radixchat.webui.api.generation import CLIENT_GONE, Ledger
from radixchat.webui.api.shapes import replies as rp
from radixchat.webui.api.shapes.schema import ChatCompletionRequest, CompletionRequest

router = APIRouter(prefix="/v1", tags=["chat"])


@router.post("/chat/completions")
async def chat_completions(
    request: Request,
    body: ChatCompletionRequest,
    user: UserDep,
    engines: EnginesDep,
    store: StoreDep,
    metrics: MetricsDep,
) -> Response:
    engine = await engine_for(engines, body.model)
    family = engine.info.tool_format if body.calls_tools() else None
    try:
        tools, lark = toolcalls.request_side(body, family)
    except toolcalls.ToolsUnsupported as e:
        raise ApiError(400, str(e), code="tools_unsupported", param="tools") from None
    except ValueError as e:  # a forced call no tool's parameters let finish
        raise invalid(e, "tools") from None
    messages = [m.for_template() for m in body.messages]
    thinking = body.thinking()
    if thinking is not None and not engine.info.thinking_switch:
        raise ApiError(
            400, "reasoning_effort: this model's chat template has no thinking switch", param="reasoning_effort"
        )
    ledger = Ledger(metrics, store, engine.info.model_id, user, "chat", watch=watch_of(request, user))
    handles = await generation.submit_choices(
        ledger,
        body.n,
        body.sampling(engine.info.sampling_defaults),
        lambda sampling: engine.asubmit(
            ChatRequest(
                messages=messages,
                tools=tools,
                sampling=sampling.model_copy(update={"lark": lark}),
                **charged_to(user),
                thinking=thinking,
            )
        ),
    )
    frames = ChatFrames(
        engine.info.model_id, len(handles), _include_usage(body), family if tools else None, forced=lark is not None
    )
    if body.stream:
        return generation.stream(handles, frames, ledger)
    finals, gone = await generation.wait_for_ends(request, handles, ledger)
    # the client left and the request was cancelled: its rows say so (RequestEnd), and
    # there is nobody to send a body to
    return Response(status_code=CLIENT_GONE) if gone else JSONResponse(frames.whole(finals).model_dump())


@router.post("/completions")
async def completions(
    request: Request,
    body: CompletionRequest,
    user: UserDep,
    engines: EnginesDep,
    store: StoreDep,
    metrics: MetricsDep,
) -> Response:
    engine = await engine_for(engines, body.model)
    ledger = Ledger(metrics, store, engine.info.model_id, user, "completions", watch=watch_of(request, user))
    handles = await generation.submit_choices(
        ledger,
        body.n,
        body.sampling(engine.info.sampling_defaults),
        lambda sampling: engine.asubmit(PromptRequest(prompt=body.prompt, sampling=sampling, **charged_to(user))),
    )
    frames = CompletionFrames(
        engine.info.model_id, len(handles), _include_usage(body), str(body.prompt) if body.echo else ""
    )
    if body.stream:
        return generation.stream(handles, frames, ledger)
    finals, gone = await generation.wait_for_ends(request, handles, ledger)
    return Response(status_code=CLIENT_GONE) if gone else JSONResponse(frames.whole(finals).model_dump())


def _include_usage(body: ChatCompletionRequest | CompletionRequest) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)


def _sse(chunk: rp.ChatCompletionChunk | rp.Completion) -> str:
    return f"data: {chunk.model_dump_json(exclude=None if chunk.usage else {'usage'})}\n\n"


class _Frames:
    """What both APIs' replies share: the id, the failure chunk, usage and [DONE] at the end."""

    def __init__(self, model: str, n: int, include_usage: bool, prefix: str) -> None:
        self.id, self.model, self.n, self.include_usage = rp.new_id(prefix), model, n, include_usage

    def failed(self, i: int, ev: Failed) -> list[str]:
        type_, code = ("invalid_request_error", "invalid_schema") if ev.theirs else ("server_error", "engine_error")
        error = rp.ErrorResponse(error=rp.ErrorBody(message=ev.message, type=type_, code=code))
        return [f"data: {error.model_dump_json()}\n\n"]

    async def closing(self, finals: list[Finished] | None) -> list[str]:
        out: list[str] = []
        if self.include_usage and finals is not None:
            out.append(_sse(self._usage_chunk(rp.usage_of_choices([ev.usage for ev in finals]))))
        return [*out, "data: [DONE]\n\n"]

    def _usage_chunk(self, usage: rp.Usage) -> rp.ChatCompletionChunk | rp.Completion:
        raise NotImplementedError


class ChatFrames(_Frames):
    """A chat completion's reply: whole, or chunk by chunk; with `tool_family`, calls in the
    text become tool_calls (held back while streaming until the call is whole)."""

    def __init__(self, model: str, n: int, include_usage: bool, tool_family: str | None, forced: bool = False) -> None:
        super().__init__(model, n, include_usage, "chatcmpl")
        self.family, self.forced = tool_family, forced
        self.streams = [toolcalls.Stream(tool_family, forced) for _ in range(n)] if tool_family else None

    def whole(self, finals: list[Finished]) -> rp.ChatCompletion:
        choices = []
        for i, ev in enumerate(finals):
            content, calls, called = toolcalls.reply(self.family, ev.text, self.forced)
            choices.append(
                rp.ChatChoice(
                    index=i,
                    message=rp.ChoiceMessage(content=content, tool_calls=calls),
                    finish_reason="tool_calls" if called else ev.finish_reason,
                    logprobs=rp.chat_logprobs(ev.logprobs),
                )
            )
        usage = rp.usage_of_choices([ev.usage for ev in finals])
        return rp.ChatCompletion(id=self.id, model=self.model, usage=usage, choices=choices)

    def _chunk(
        self,
        i: int,
        *,
        content: str | None = None,
        finish: str | None = None,
        role: Literal["assistant"] | None = None,
        logprobs: list[TokenLogprob] | None = None,
        calls: list[dict[str, Any]] | None = None,
    ) -> str:
        delta = rp.Delta(role=role, content=content, tool_calls=calls)
        choice = rp.ChunkChoice(index=i, delta=delta, finish_reason=finish, logprobs=rp.chat_logprobs(logprobs))
        return _sse(rp.ChatCompletionChunk(id=self.id, model=self.model, choices=[choice]))

    def _usage_chunk(self, usage: rp.Usage) -> rp.ChatCompletionChunk:
        return rp.ChatCompletionChunk(id=self.id, model=self.model, usage=usage, choices=[])

    def opening(self) -> list[str]:
        return [self._chunk(i, role="assistant", content="") for i in range(self.n)]

    def delta(self, i: int, ev: TextDelta) -> list[str]:
        if not self.streams:
            return [self._chunk(i, content=ev.text, logprobs=ev.logprobs)]
        text = self.streams[i].feed(ev.text)
        return [self._chunk(i, content=text, logprobs=ev.logprobs)] if text else []

    def finished(self, i: int, ev: Finished) -> list[str]:
        out: list[str] = []
        finish: str = ev.finish_reason
        if self.streams:
            rest, calls = self.streams[i].finish()
            if rest:
                out.append(self._chunk(i, content=rest))
            if calls:
                out.append(self._chunk(i, calls=calls))
                finish = "tool_calls"
        return [*out, self._chunk(i, finish=finish)]


class CompletionFrames(_Frames):
    """A completion's reply: whole, or chunk by chunk; `echo` starts every choice's text."""

    def __init__(self, model: str, n: int, include_usage: bool, echo: str) -> None:
        super().__init__(model, n, include_usage, "cmpl")
        self.echo = echo
        self.sent = [0] * n  # characters streamed so far per choice (logprobs' text_offset)

    def whole(self, finals: list[Finished]) -> rp.Completion:
        choices = [
            rp.TextChoice(
                index=i,
                text=self.echo + ev.text,
                finish_reason=ev.finish_reason,
                logprobs=rp.completion_logprobs(ev.logprobs),
            )
            for i, ev in enumerate(finals)
        ]
        usage = rp.usage_of_choices([ev.usage for ev in finals])
        return rp.Completion(id=self.id, model=self.model, usage=usage, choices=choices)

    def _chunk(
        self,
        i: int,
        *,
        content: str | None = None,
        finish: str | None = None,
        logprobs: list[TokenLogprob] | None = None,
    ) -> str:
        shaped = rp.completion_logprobs(logprobs, self.sent[i])
        choice = rp.TextChoice(index=i, text=content or "", finish_reason=finish, logprobs=shaped)
        return _sse(rp.Completion(id=self.id, model=self.model, choices=[choice]))

    def _usage_chunk(self, usage: rp.Usage) -> rp.Completion:
        return rp.Completion(id=self.id, model=self.model, usage=usage, choices=[])

    def opening(self) -> list[str]:
        return [self._chunk(i, content=self.echo) for i in range(self.n)] if self.echo else []

    def delta(self, i: int, ev: TextDelta) -> list[str]:
        out = [self._chunk(i, content=ev.text, logprobs=ev.logprobs)]
        self.sent[i] += len(ev.text)
        return out

    def finished(self, i: int, ev: Finished) -> list[str]:
        return [self._chunk(i, finish=ev.finish_reason)]
