"""Anthropic's Messages API in radixchat's terms: the request (`MessagesRequest`), turned into
the chat messages, tools and sampling the engine takes; the reply whole (`message`) and as
Anthropic's server-sent events (`MessageEvents`, a webui/api/generation.py Framing).

What is read: `system` (a string or text blocks), `messages` (text, `tool_use` and
`tool_result` blocks), `max_tokens`, `stop_sequences`, `stream`, `tools` and `tool_choice`
(auto, any, tool, none), `output_config.format` (a JSON schema the reply's text follows,
compiled as chat completions' `response_format` is), and `temperature`, `top_p`, `top_k`, which Anthropic's API had and
older clients still send (left out: the model card's sampling). Accepted and ignored, as
they cannot change the reply here: `metadata`, `service_tier`, `speed`, `inference_geo`,
`user_profile_id`, `workspace_id`, `diagnostics`, `cache_control` (top-level, on any block
or tool: the prefix cache keeps every prompt's prefix anyway), `thinking` of type
"disabled", and on a `tool_use` block `caller` (`direct`) and `toolset_name`, which the
anthropic SDK's own blocks carry back. Anything else (images, documents, thinking, `output_config.effort`, `container`, server
tools, a last assistant message to continue) is refused by name. Tool calls are the model's tool-call format's (or the generic
one), parsed out of the reply as the chat API does (webui/api/toolcalls.py) and sent as
`tool_use` blocks; streamed, a call goes out whole at the end (`input_json_delta`). Usage:
`input_tokens` are the prompt tokens the engine computed, `cache_read_input_tokens` those the
prefix cache gave it. Pure functions and the framing object, on the server's event loop;
no MLX.
"""

from __future__ import annotations

import json
import secrets
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from radixchat.core.seam import tools as formats
from radixchat.core.seam.requests import Failed, Finished, TextDelta, Usage
from radixchat.webui.api import toolcalls
from radixchat.webui.api.shapes.fields import penalties, refuse_lone_surrogate, with_defaults

Ignored = dict[str, Any] | None  # cache_control: accepted, not used (see the module's docstring)


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cache_control: Ignored = None


class TextBlock(_Block):
    type: Literal["text"]
    text: str
    citations: None = None


class DirectCaller(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["direct"]  # a server tool's caller (code execution) is not served here


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=128)
    input: dict[str, Any]
    # what the anthropic SDK's own block carries back (`model_dump()`): they inform, so
    # they are accepted and left out of the prompt
    caller: DirectCaller | None = None
    toolset_name: str | None = Field(None, max_length=256)


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: str | list[TextBlock] = ""
    is_error: bool | None = None

    def text(self) -> str:
        body = self.content if isinstance(self.content, str) else "".join(b.text for b in self.content)
        return f"Error: {body}" if self.is_error else body


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


BLOCK_TYPES = ("text", "tool_use", "tool_result")


def _known_blocks(v: Any) -> Any:
    """A block of a type not served here is refused by its type, before pydantic's union
    says only that the content is not a string."""
    if isinstance(v, list):
        for b in v:
            kind = b.get("type") if isinstance(b, dict) else None
            if kind not in BLOCK_TYPES:
                raise ValueError(f"{kind!r} blocks are not supported here (only {', '.join(BLOCK_TYPES)})")
    return v


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant"]
    content: str | list[Block]

    _blocks = field_validator("content", mode="before")(_known_blocks)

    @model_validator(mode="after")
    def _not_empty(self) -> Message:
        if isinstance(self.content, list) and not self.content:
            raise ValueError("content: at least one block")
        return self

    def blocks(self) -> list[Block]:
        """Its content as blocks: a string is one text block."""
        return [TextBlock(type="text", text=self.content)] if isinstance(self.content, str) else self.content


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=128, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: Ignored = None


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None  # one call a reply here anyway

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError('name is given with type "tool", and only then')
        return self


class Thinking(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["disabled"]  # "enabled" is refused: no thinking budget here


class JsonOutputFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    """Structured output (`format`), through the same grammar path as chat completions'
    `response_format`; `effort` (a thinking budget) is not served here."""

    model_config = ConfigDict(extra="forbid", strict=True)
    format: JsonOutputFormat | None = None
    effort: str | None = None

    @field_validator("effort")
    @classmethod
    def _no_effort(cls, v: str | None) -> str | None:
        if v is not None:
            raise ValueError("not supported here (this server has no thinking budget)")
        return v


class MessagesBody(BaseModel):
    """A Messages API body, `max_tokens` optional: what `count_tokens` takes (a count has no
    reply to bound); `MessagesRequest` narrows it to required, in the same place."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = None
    system: str | list[TextBlock] | None = None
    stop_sequences: list[Annotated[str, Field(min_length=1, max_length=1000)]] | None = Field(None, max_length=8)
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    output_config: OutputConfig | None = None
    # accepted and ignored: they cannot change the reply here
    metadata: Ignored = None
    service_tier: str | None = None
    cache_control: Ignored = None
    speed: str | None = None
    inference_geo: str | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None
    diagnostics: Ignored = None
    thinking: Thinking | None = None

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        """A lone surrogate anywhere is refused by where it is, as the OpenAI routes refuse it
        (it reached the tokenizer, whose complaint named no field)."""
        refuse_lone_surrogate(data)
        return data

    @model_validator(mode="after")
    def _choice_in_tools(self) -> MessagesBody:
        choice = self.tool_choice
        if choice is not None and choice.type == "tool" and choice.name not in {t.name for t in self.tools or []}:
            raise ValueError("tool_choice.name: names a tool that is not in tools")
        if choice is not None and choice.type == "any" and not self.tools:
            raise ValueError("tool_choice: any needs tools")
        return self

    @model_validator(mode="after")
    def _format_or_forced_call(self) -> MessagesBody:
        if (
            self.reply_schema() is not None
            and self.tool_choice is not None
            and self.tool_choice.type in ("any", "tool")
        ):
            raise ValueError(
                "output_config.format: cannot be combined with a forced tool call (tool_choice any or tool)"
            )
        return self

    def reply_schema(self) -> dict[str, Any] | None:
        """The JSON schema the reply's text must follow (None: free text)."""
        fmt = self.output_config.format if self.output_config else None
        return fmt.schema_ if fmt else None

    @model_validator(mode="after")
    def _ends_with_user_or_prefill(self) -> MessagesBody:
        """The last message is the user's, or the start of the answer (a prefill) for the
        reply to go on from: text only, after a user's message, as Anthropic's API takes it."""
        last = self.messages[-1]
        if last.role == "user":
            return self
        blocks = last.blocks()
        if not all(isinstance(b, TextBlock) for b in blocks) or len(self.messages) < 2:
            raise ValueError("messages: the last message must come from the user, or be the text an answer starts with")
        text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
        if text != text.rstrip():
            raise ValueError("messages: final assistant content cannot end with trailing whitespace")
        if self.reply_schema() is not None:
            raise ValueError("output_config.format: cannot be combined with a prefilled answer")
        return self

    def prefilled(self) -> bool:
        """The last message starts the answer: the reply is what follows it."""
        return self.messages[-1].role == "assistant"

    def calls_tools(self) -> bool:
        return bool(self.tools) and (self.tool_choice is None or self.tool_choice.type != "none")

    def chat_messages(self) -> list[dict[str, Any]]:
        """The conversation as chat messages: tool uses as an assistant's tool_calls, tool
        results as tool messages (before the user's text of the same turn)."""
        out: list[dict[str, Any]] = []
        if self.system:
            text = self.system if isinstance(self.system, str) else "\n".join(b.text for b in self.system)
            out.append({"role": "system", "content": text})
        for m in self.messages:
            blocks = m.blocks()
            text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
            if m.role == "assistant":
                calls = [
                    {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input}}
                    for b in blocks
                    if isinstance(b, ToolUseBlock)
                ]
                out.append({"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})})
                continue
            for b in blocks:
                if isinstance(b, ToolUseBlock):
                    raise ValueError("messages: tool_use blocks belong to assistant messages")
                if isinstance(b, ToolResultBlock):
                    out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text()})
            if text or not any(isinstance(b, ToolResultBlock) for b in blocks):
                out.append({"role": "user", "content": text})
        return out

    def chat_tools(self) -> list[dict[str, Any]] | None:
        if not self.calls_tools():
            return None
        return [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description or "", "parameters": t.input_schema},
            }
            for t in self.tools or []
        ]

    def grammar(self, family: str | None) -> str | None:
        """The forced call's grammar: `any` (one of the tools) or a named `tool`."""
        tools, choice = self.chat_tools(), self.tool_choice
        if not tools or choice is None or choice.type not in ("any", "tool") or family is None:
            return None
        return formats.grammar(family, tools, only=choice.name)


class MessagesRequest(MessagesBody):
    max_tokens: int = Field(ge=1)  # required for a reply (Anthropic's API requires it)

    def sampling(self, defaults: dict[str, float]) -> dict[str, Any]:
        """The engine's sampling fields, what the request left out from `defaults` (the model
        card's), as the OpenAI routes fill them (webui/api/shapes/fields.py)."""
        return {
            **with_defaults(self.temperature, self.top_p, defaults),
            "top_k": self.top_k or 0,
            "max_tokens": self.max_tokens,
            "stop": self.stop_sequences or [],
            "json_schema": self.reply_schema(),
            **penalties(self, defaults),  # none in Anthropic's API: the card's, else off
        }


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def usage(u: Usage) -> dict[str, int]:
    return {
        "input_tokens": u.prompt_tokens - u.cached_tokens,
        "output_tokens": u.generated_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def stop_reason(final: Finished, called: bool) -> tuple[str, str | None]:
    if called:
        return "tool_use", None
    if final.stop_sequence is not None:
        return "stop_sequence", final.stop_sequence
    return ("max_tokens" if final.finish_reason == "length" else "end_turn"), None


def tool_use(call: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-shaped parsed call as a tool_use block."""
    try:
        args = json.loads(call["function"]["arguments"])
    except ValueError:
        args = {}
    return {"type": "tool_use", "id": new_id("toolu"), "name": call["function"]["name"], "input": args}


def message(mid: str, model: str, final: Finished, family: str | None, forced: bool = False) -> dict[str, Any]:
    """The whole reply as Anthropic's Message object (`forced`: a call was required)."""
    content, calls, called = toolcalls.reply(family, final.text, forced)
    blocks = [{"type": "text", "text": content}] if content else []
    blocks += [tool_use(c) for c in calls or []]
    reason, seq = stop_reason(final, called)
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": usage(final.usage),
    }


def sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class MessageEvents:
    """One reply as Anthropic's events: message_start, a ping, the text block's start, its
    deltas and stop, any tool_use blocks (whole, as one input_json_delta each), then
    message_delta (stop reason, usage) and message_stop; a failure is an `error` event."""

    def __init__(self, mid: str, model: str, prompt_tokens: int, family: str | None, forced: bool = False) -> None:
        self.mid, self.model, self.prompt_tokens, self.family = mid, model, prompt_tokens, family
        self.stream = toolcalls.Stream(family, forced) if family else None
        self.text_open = False

    def opening(self) -> list[str]:
        start = message(self.mid, self.model, Finished("", "stop"), None)
        start.update(stop_reason=None, usage={**usage(Usage(prompt_tokens=self.prompt_tokens)), "output_tokens": 0})
        return [sse("message_start", {"type": "message_start", "message": start}), sse("ping", {"type": "ping"})]

    def _text(self, text: str) -> list[str]:
        out: list[str] = []
        if not self.text_open:
            self.text_open = True
            block = {"type": "text", "text": ""}
            out.append(sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}))
        delta = {"type": "text_delta", "text": text}
        out.append(sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}))
        return out

    def delta(self, i: int, ev: TextDelta) -> list[str]:
        text = self.stream.feed(ev.text) if self.stream else ev.text
        return self._text(text) if text else []

    def finished(self, i: int, ev: Finished) -> list[str]:
        out, calls = [], None
        if self.stream:
            rest, calls = self.stream.finish()
            out += self._text(rest) if rest else []
        index = 0
        if self.text_open:
            out.append(sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
            index = 1
        for k, call in enumerate(calls or []):
            block = tool_use(call)
            args = json.dumps(block.pop("input"), separators=(",", ":"))
            block["input"] = {}
            at = index + k
            out.append(sse("content_block_start", {"type": "content_block_start", "index": at, "content_block": block}))
            delta = {"type": "input_json_delta", "partial_json": args}
            out.append(sse("content_block_delta", {"type": "content_block_delta", "index": at, "delta": delta}))
            out.append(sse("content_block_stop", {"type": "content_block_stop", "index": at}))
        reason, seq = stop_reason(ev, bool(calls))
        end = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": seq},
            "usage": usage(ev.usage),
        }
        return [*out, sse("message_delta", end)]

    def failed(self, i: int, ev: Failed) -> list[str]:
        kind = "invalid_request_error" if ev.theirs else "api_error"
        return [sse("error", {"type": "error", "error": {"type": kind, "message": ev.message}})]

    async def closing(self, finals: list[Finished] | None) -> list[str]:
        return [sse("message_stop", {"type": "message_stop"})] if finals is not None else []
