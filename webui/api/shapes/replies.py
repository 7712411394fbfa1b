"""Reply bodies of the chat, completions and models APIs, and the error body, as pydantic
models in OpenAI's shape, with the helpers that fill them (usage over n choices, logprobs
in each API's form, ids). Building them from engine events is webui/api/chat.py's job; the
request side is webui/api/shapes/schema.py. Pure data on the event loop; no MLX.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from radixchat.core.seam import requests as seam


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


def usage_of(u: seam.Usage) -> Usage:
    return Usage(
        prompt_tokens=u.prompt_tokens,
        completion_tokens=u.generated_tokens,
        total_tokens=u.prompt_tokens + u.generated_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=u.cached_tokens),
    )


def usage_of_choices(usages: list[seam.Usage]) -> Usage:
    """One request's usage over its n choices: the prompt counts once, the completions add up,
    and cached_tokens are the prompt tokens the request did not compute (a prompt computed
    once for n choices reports what one choice would)."""
    if len(usages) == 1:
        return usage_of(usages[0])
    prompt = usages[0].prompt_tokens
    computed = sum(u.prompt_tokens - u.cached_tokens for u in usages)
    completion = sum(u.generated_tokens for u in usages)
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=max(0, prompt - computed)),
    )


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


class ChoiceMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[dict[str, Any]] | None = None


def _token(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(entries: list[seam.TokenLogprob] | None) -> dict[str, Any] | None:
    """OpenAI's chat `logprobs` object for these TokenLogprobs (None: not asked for)."""
    if entries is None:
        return None
    return {
        "content": [
            {**_token(e.token, e.logprob), "top_logprobs": [_token(t, lp) for t, lp in e.top]} for e in entries
        ],
        "refusal": None,
    }


def completion_logprobs(entries: list[seam.TokenLogprob] | None, offset: int = 0) -> dict[str, Any] | None:
    """The legacy completions `logprobs` object; `offset`: characters of text before these."""
    if entries is None:
        return None
    offsets: list[int] = []
    for e in entries:
        offsets.append(offset)
        offset += len(e.token)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [dict(e.top) for e in entries],
        "text_offset": offsets,
    }


class ChatChoice(BaseModel):
    index: int = 0
    message: ChoiceMessage
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class TextChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[TextChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "radixchat"
    loaded: bool = True  # beyond OpenAI's card, as llama-server's router says it: in memory now
    aliases: list[str] = Field(default_factory=list)  # other names a request may give it


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody
