"""Request and response bodies of the OpenAI-compatible API, as pydantic models.

They follow OpenAI's schema, with one rule for every field a request may carry
(`FIELDS`, the README's parameter table): a field this server implements is used; an
informational one (it cannot change the reply: `user`, `metadata`, `store`...) is accepted
and ignored; one it does not implement is refused with a 400 naming it unless it holds its
"off" value (`logprobs: false`, `response_format: {"type": "text"}`, null), which is what
clients send when they mean nothing by it; a field OpenAI's API does not have is refused.
Image, audio and file parts are refused: the model takes text only. Turning the bodies into
engine requests is webui/api/routes.py's job.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_CHOICES = 16  # n: each choice is a request in the engine, counted against the user's limit


def _off(name: str, value) -> bool:
    """Does this value of a refused field ask for nothing (what clients send by default)?"""
    if name == "best_of":
        return value in (None, 1)
    return value in (None, False, 0, "", [], {}, "none", "auto") or value == {"type": "text"} or value == ["text"]


# Both APIs: what each field a request may carry does here. "used": implemented; "ignored":
# informational, accepted; "refused": not implemented, a 400 unless off (_off).
COMMON = {
    "model": "used",
    "max_tokens": "used",
    "temperature": "used",
    "top_p": "used",
    "stop": "used",
    "stream": "used",
    "stream_options": "used",
    "seed": "used",
    "n": "used",
    "presence_penalty": "used",
    "frequency_penalty": "used",
    "top_k": "used",
    "ignore_eos": "used",
    "user": "ignored",
    "logit_bias": "used",
    "logprobs": "used",
}
FIELDS = {
    "chat": {
        **COMMON,
        "messages": "used",
        "max_completion_tokens": "used",
        "metadata": "ignored",
        "store": "ignored",
        "service_tier": "ignored",
        "safety_identifier": "ignored",
        "prompt_cache_key": "ignored",
        "parallel_tool_calls": "ignored",
        "top_logprobs": "used",
        "response_format": "used",
        "tools": "used",
        "tool_choice": "used",
        "functions": "refused",
        "function_call": "refused",
        "audio": "refused",
        "modalities": "refused",
        "prediction": "refused",
        "reasoning_effort": "refused",
        "verbosity": "refused",
        "web_search_options": "refused",
    },
    "completions": {**COMMON, "prompt": "used", "echo": "used", "best_of": "refused", "suffix": "refused"},
}
NOT_YET = {
    "response_format": "structured output",
    "tools": "tool calling",
    "tool_choice": "tool calling",
    "functions": "function calling",
    "function_call": "function calling",
    "audio": "audio output",
    "modalities": "audio output",
}


def check_fields(data, table: dict[str, str], api: str):
    """The one rule of the module docstring, on the raw body (before pydantic reads it):
    `table` says what each field of `api` (its name, for the message) does here."""
    if not isinstance(data, dict):
        return data
    for name, value in data.items():
        use = table.get(name)
        if use is None:
            raise ValueError(
                f"{name}: unknown field (this server takes the fields of OpenAI's {api} API it lists in its README)"
            )
        if use == "refused" and not _off(name, value):
            what = NOT_YET.get(name, name)
            raise ValueError(f"{name}: {what} is not supported by this server")
    return {k: v for k, v in data.items() if table[k] == "used"}


def with_defaults(temperature: float | None, top_p: float | None, defaults: dict | None) -> dict:
    """The request's temperature and top_p; what it left out from `defaults` (the model card's
    recommendation), else OpenAI's 1.0."""
    defaults = defaults or {}
    return {
        "temperature": temperature if temperature is not None else defaults.get("temperature", 1.0),
        "top_p": top_p if top_p is not None else defaults.get("top_p", 1.0),
    }


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None  # calls are always held to the parameters' schema here


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: ToolFunction


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: str  # JSON, as OpenAI sends it


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # the call a tool message answers

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data):
        if not isinstance(data, dict):
            return data
        if data.get("role") == "function" or data.get("function_call"):
            raise ValueError("the legacy function-calling fields are not supported: use tools")
        parts = data.get("content")
        if isinstance(parts, list):
            for part in parts:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind in ("image_url", "input_image", "input_audio", "file", "image", "audio"):
                    raise ValueError(f"content: this model takes text only (got a {kind} part)")
        # informational fields of a message; anything else is refused by extra="forbid"
        return {k: v for k, v in data.items() if k not in ("refusal", "annotations", "audio")}

    @model_validator(mode="after")
    def _has_content(self):
        if self.content is None and not self.tool_calls:
            raise ValueError("content: missing (only an assistant message with tool_calls may leave it out)")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("tool_call_id: a tool message says which call it answers")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("tool_calls: only an assistant message makes calls")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def for_template(self) -> dict:
        """The message as chat templates take it (arguments as objects, as HF templates expect)."""
        out = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": _loads_or_text(c.function.arguments)},
                }
                for c in self.tool_calls
            ]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.name and self.role == "tool":
            out["name"] = self.name
        return out


def _loads_or_text(arguments: str):
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    # left out: the model's recommended value (core.engine.catalog), else OpenAI's 1.0
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    user: str | None = None
    ignore_eos: bool = False  # an extension (as vLLM's): generate exactly max_tokens
    logit_bias: dict[str, float] | None = None  # token id (as a string, JSON's keys) -> bias

    @field_validator("logit_bias")
    @classmethod
    def _bias_keys(cls, v):
        if v and not all(k.strip().isdigit() for k in v):
            raise ValueError('keys must be token ids, e.g. {"50256": -100}')
        return v

    def _top(self) -> int | None:
        """How many alternatives per token to report; None: no logprobs (per API below)."""
        return None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4:
            raise ValueError("at most 4 stop sequences")
        if any(s == "" for s in stops):
            raise ValueError("stop sequences must not be empty")
        return stops

    @model_validator(mode="after")
    def _supported(self):
        if self.presence_penalty or self.frequency_penalty:
            raise ValueError("presence_penalty and frequency_penalty are not supported (use 0)")
        return self

    def sampling(self, defaults: dict | None = None) -> dict:
        """The engine's sampling fields; `defaults` fill what the request left out."""
        return {
            **with_defaults(self.temperature, self.top_p, defaults),
            "top_k": self.top_k,
            "max_tokens": self.max_tokens,
            "stop": self.stop or [],
            "seed": self.seed,
            "ignore_eos": self.ignore_eos,
            "logprobs": self._top(),
            "logit_bias": {int(k): b for k, b in (self.logit_bias or {}).items()},
        }


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    schema_: dict = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None  # the schema is always enforced here


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema: give it exactly with type json_schema")
        return self

    def schema(self) -> dict | None:
        """The JSON schema the reply must follow (None: free text)."""
        if self.type == "json_object":
            return {"type": "object"}
        return self.json_schema.schema_ if self.json_schema else None


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None

    @model_validator(mode="after")
    def _tools_checks(self):
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in {
            t.function.name for t in self.tools or []
        }:
            raise ValueError("tool_choice: names a function that is not in tools")
        if self.tool_choice == "required" and not self.tools:
            raise ValueError("tool_choice: required needs tools")
        if self.calls_tools() and self.response_format and self.response_format.type != "text":
            raise ValueError("response_format: cannot be combined with tools")
        return self

    def calls_tools(self) -> bool:
        """Are tools given to the model (tool_choice "none" keeps them away)?"""
        return bool(self.tools) and self.tool_choice != "none"

    def sampling(self, defaults: dict | None = None) -> dict:
        schema = self.response_format.schema() if self.response_format else None
        return {**super().sampling(defaults), "json_schema": schema}

    def _top(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @model_validator(mode="before")
    @classmethod
    def _fields(cls, data):
        return check_fields(data, FIELDS["chat"], "chat completions")

    @model_validator(mode="after")
    def _chat_checks(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs: true")
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    logprobs: int | None = Field(None, ge=0, le=5)  # the legacy API's: alternatives per token
    echo: bool = False  # the reply starts with the prompt

    @model_validator(mode="after")
    def _echo(self):
        if self.echo and self.logprobs is not None:
            raise ValueError(
                "echo: with logprobs it needs the prompt's log-probabilities, which this server does not report"
            )
        return self

    def _top(self) -> int | None:
        return self.logprobs

    @model_validator(mode="before")
    @classmethod
    def _fields(cls, data):
        return check_fields(data, FIELDS["completions"], "completions")

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list):
            if len(v) != 1:
                raise ValueError("prompt: exactly one prompt is supported")
            v = v[0]
        if not v:
            raise ValueError("prompt must not be empty")
        return v


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


def usage_of(u) -> Usage:
    return Usage(
        prompt_tokens=u.prompt_tokens,
        completion_tokens=u.generated_tokens,
        total_tokens=u.prompt_tokens + u.generated_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=u.cached_tokens),
    )


def usage_of_choices(usages) -> Usage:
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
    tool_calls: list[dict] | None = None


def _token(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(entries) -> dict | None:
    """OpenAI's chat `logprobs` object for these TokenLogprobs (None: not asked for)."""
    if entries is None:
        return None
    return {
        "content": [
            {**_token(e.token, e.logprob), "top_logprobs": [_token(t, lp) for t, lp in e.top]} for e in entries
        ],
        "refusal": None,
    }


def completion_logprobs(entries, offset: int = 0) -> dict | None:
    """The legacy completions `logprobs` object; `offset`: characters of text before these."""
    if entries is None:
        return None
    offsets = []
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
    logprobs: dict | None = None


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
    tool_calls: list[dict] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: dict | None = None


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
    logprobs: dict | None = None


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
