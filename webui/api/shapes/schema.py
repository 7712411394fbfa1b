"""Request bodies of the chat completions and completions APIs, as pydantic models.

They follow OpenAI's schema; which fields each API takes, and what each does here, is
webui/api/shapes/fields.py's table, checked on the raw body before a model reads it. Image, audio
and file parts are refused: the model takes text only. The reply bodies are
webui/api/shapes/replies.py; turning a request into engine requests is webui/api/chat.py's job.
Validation runs on the server's event loop (FastAPI reads the body there); no MLX.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from radixchat.webui.api.shapes.fields import FIELDS, check_fields, penalties, with_defaults

MAX_CHOICES = 16  # n: each choice is a request in the engine, counted against the user's limit


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
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


INFORMATIONAL = ("refusal", "annotations", "audio", "parsed")  # of a message: accepted, cannot change the reply


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # the call a tool message answers

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
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
        # informational fields of a message (an assistant's as the openai SDK dumps it: `parsed`
        # is its parse of the content), and the legacy call's field in its off value (the SDK's
        # `model_dump()` of any reply holds `"function_call": null`); anything else is refused by
        # extra="forbid"
        return {k: v for k, v in data.items() if k not in INFORMATIONAL and not (k == "function_call" and v is None)}

    @model_validator(mode="after")
    def _has_content(self) -> Message:
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

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates take it (arguments as objects, as HF templates expect)."""
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
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


def _loads_or_text(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)
    include_usage: bool = False


class _Sampling(BaseModel):
    # strict: a value of the wrong JSON type is refused, never coerced (`max_tokens: true` was
    # read as 1, `stream: "yes"` as true, `"5"` as 5), as OpenAI's and Anthropic's APIs refuse them
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str
    # left out: the model's recommended value (core.models.catalog), else OpenAI's 1.0
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    # left out: the model card's recommendation, else off (core/engine/sample/sampling.py applies them)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0)  # an extension, as vLLM's
    min_p: float = Field(0.0, ge=0.0, le=1.0)  # an extension, as vLLM's (0: off)
    user: str | None = None
    ignore_eos: bool = False  # an extension (as vLLM's): generate exactly max_tokens
    logit_bias: dict[str, float] | None = None  # token id (as a string, JSON's keys) -> bias

    @field_validator("logit_bias")
    @classmethod
    def _bias_keys(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v and not all(k.strip().isdigit() for k in v):
            raise ValueError('keys must be token ids, e.g. {"50256": -100}')
        return v

    def _top(self) -> int | None:
        """How many alternatives per token to report; None: no logprobs (per API below)."""
        return None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> list[str]:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4:
            raise ValueError("at most 4 stop sequences")
        if any(s == "" for s in stops):
            raise ValueError("stop sequences must not be empty")
        return stops

    def sampling(self, defaults: dict[str, float] | None = None) -> dict[str, Any]:
        """The engine's sampling fields; `defaults` fill what the request left out."""
        return {
            **with_defaults(self.temperature, self.top_p, defaults),
            "top_k": self.top_k,
            "min_p": self.min_p,
            "max_tokens": self.max_tokens,
            "stop": self.stop or [],
            "seed": self.seed,
            "ignore_eos": self.ignore_eos,
            "logprobs": self._top(),
            "logit_bias": {int(k): b for k, b in (self.logit_bias or {}).items()},
            **penalties(self, defaults),
        }


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(min_length=1, max_length=64)
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None  # the schema is always enforced here


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema: give it exactly with type json_schema")
        return self

    def reply_schema(self) -> dict[str, Any] | None:
        """The JSON schema the reply must follow (None: free text)."""
        if self.type == "json_object":
            return {"type": "object"}
        return self.json_schema.schema_ if self.json_schema else None


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
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
    # for a model whose template has a thinking switch: "none" and "minimal" turn it off
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None

    def thinking(self) -> bool | None:
        """The template's thinking switch this request asks for (None: its default)."""
        if self.reasoning_effort is None:
            return None
        return self.reasoning_effort not in ("none", "minimal")

    @model_validator(mode="after")
    def _tools_checks(self) -> ChatCompletionRequest:
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

    def sampling(self, defaults: dict[str, float] | None = None) -> dict[str, Any]:
        schema = self.response_format.reply_schema() if self.response_format else None
        return {**super().sampling(defaults), "json_schema": schema}

    def _top(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @model_validator(mode="before")
    @classmethod
    def _fields(cls, data: Any) -> Any:
        return check_fields(data, FIELDS["chat"], "chat completions")

    @model_validator(mode="after")
    def _chat_checks(self) -> ChatCompletionRequest:
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
    def _echo(self) -> CompletionRequest:
        if self.echo and self.logprobs is not None:
            raise ValueError(
                "echo: with logprobs it needs the prompt's log-probabilities, which this server does not report"
            )
        return self

    def _top(self) -> int | None:
        return self.logprobs

    @model_validator(mode="before")
    @classmethod
    def _fields(cls, data: Any) -> Any:
        return check_fields(data, FIELDS["completions"], "completions")

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[str]) -> str:
        if isinstance(v, list):
            if len(v) != 1:
                raise ValueError("prompt: exactly one prompt is supported")
            v = v[0]
        if not v:
            raise ValueError("prompt must not be empty")
        return v
