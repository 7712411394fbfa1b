"""The Responses API's request and reply shapes: `ResponsesRequest` (its fields under the
one rule of webui/api/shapes/fields.py), the Response object, and `ResponseEvents`, the SSE
events of one streamed response as the SDK reads them (response.created ...
output_text.delta ... response.completed), framed for the stream loop of
webui/api/generation.py. What the routes do with them, and the store, is
webui/api/responses.py's. Runs on the server's event loop; no MLX.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from radixchat.core.seam import tools as formats
from radixchat.core.seam.requests import Failed, Finished, TextDelta, Usage
from radixchat.webui.api import toolcalls
from radixchat.webui.api.shapes.fields import FIELDS, check_fields, with_defaults

ROLES = ("user", "assistant", "system", "developer")


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # a forced call's arguments follow the schema anyway


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["function"]
    name: str


def _function_tools_only(v: Any) -> Any:
    """A hosted tool (web search, files, a computer...) is refused by its type, before
    pydantic's message about a literal."""
    for i, t in enumerate(v if isinstance(v, list) else []):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind != "function":
            raise ValueError(f"tools.{i}: only function tools are served here (not {kind!r})")
    return v


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str
    input: str | list[dict[str, Any]] = Field(min_length=1)
    instructions: str | None = None
    stream: bool = False
    previous_response_id: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None
    store: bool = True
    text: dict[str, Any] | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None

    _tools = field_validator("tools", mode="before")(_function_tools_only)

    @model_validator(mode="after")
    def _tools_checks(self) -> ResponsesRequest:
        if isinstance(self.tool_choice, NamedFunction) and self.tool_choice.name not in {
            t.name for t in self.tools or []
        }:
            raise ValueError("tool_choice: names a function that is not in tools")
        if self.tool_choice == "required" and not self.tools:
            raise ValueError("tool_choice: required needs tools")
        return self

    def echoed(self) -> dict[str, Any]:
        """What a Response object says back of the request (it said no tools and tool_choice
        "none" whatever was sent): its tools, choice and sampling as given, OpenAI's defaults
        where left out."""
        choice = self.tool_choice.model_dump() if isinstance(self.tool_choice, NamedFunction) else self.tool_choice
        return {
            "instructions": self.instructions,
            "tools": [t.model_dump(exclude_none=True) for t in self.tools or []],
            "tool_choice": choice or "auto",
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_output_tokens": self.max_output_tokens,
        }

    def calls_tools(self) -> bool:
        """Are tools given to the model (tool_choice "none" keeps them away)?"""
        return bool(self.tools) and self.tool_choice != "none"

    def forced(self) -> bool:
        return self.calls_tools() and self.tool_choice not in (None, "auto")

    def tool_side(self, family: str | None) -> tuple[list[dict[str, Any]] | None, str | None]:
        """(the tools for the chat template, the Lark grammar a forced call needs), as chat
        completions' (webui/api/toolcalls.py); ToolsUnsupported where the model has no format."""
        if not self.calls_tools():
            return None, None
        if family is None:
            raise toolcalls.ToolsUnsupported("tools: this model's chat template has no tool-call format")
        if self.reply_schema() is not None:
            raise ValueError("text.format: cannot be combined with tools")
        # as chat completions hands its tools to the template: what was not given is left out
        tools = [
            {"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type", "strict"})}
            for t in self.tools or []
        ]
        if self.tool_choice == "required":
            return tools, formats.grammar(family, tools)
        if isinstance(self.tool_choice, NamedFunction):
            return tools, formats.grammar(family, tools, only=self.tool_choice.name)
        return tools, None

    @model_validator(mode="before")
    @classmethod
    def _fields(cls, data: Any) -> Any:
        return check_fields(data, FIELDS["responses"], "Responses")

    def sampling(self, defaults: dict[str, float] | None) -> dict[str, Any]:
        """The engine's sampling fields; `defaults` fill what the request left out."""
        return {
            **with_defaults(self.temperature, self.top_p, defaults),
            "max_tokens": self.max_output_tokens,
            "seed": self.seed,
            "json_schema": self.reply_schema(),
        }

    def messages(self) -> list[dict[str, Any]]:
        """This turn's input as chat messages."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        out: list[dict[str, Any]] = []
        for i, item in enumerate(self.input):
            kind = item.get("type", "message")
            if kind in ("function_call", "function_call_output"):
                _function_item(out, item, f"input.{i}")
                continue
            if kind != "message" or item.get("role") not in ROLES:
                raise ValueError(
                    "input: only messages (user, assistant, system, developer), function_call and"
                    " function_call_output items are supported"
                )
            content = item.get("content")
            if isinstance(content, list):
                parts = []
                for p in content:
                    if not isinstance(p, dict):
                        raise ValueError("input: a message's content is text or a list of text parts (objects)")
                    if p.get("type") not in ("input_text", "output_text", "text"):
                        raise ValueError(f"input: this model takes text only (got a {p.get('type')} part)")
                    parts.append(p.get("text", ""))
                content = "".join(parts)
            if not isinstance(content, str):
                raise ValueError("input: a message's content is text or a list of text parts")
            role = "system" if item["role"] == "developer" else item["role"]
            out.append({"role": role, "content": content})
        return out

    def reply_schema(self) -> dict[str, Any] | None:
        fmt = (self.text or {}).get("format") or {"type": "text"}
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "text":
            return None
        if kind == "json_object":
            return {"type": "object"}
        if kind == "json_schema":
            schema = fmt.get("schema")
            if isinstance(schema, dict):
                return schema
        raise ValueError("text.format: text, json_object or json_schema (with its schema)")


def _function_item(out: list[dict[str, Any]], item: dict[str, Any], where: str) -> None:
    """A function call the model made (sent back as the SDK gave it) or its output, as chat
    messages: the call joins the assistant message before it, the output is a tool message."""
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise ValueError(f"{where}.call_id: a {item['type']} item needs its call_id")
    if item["type"] == "function_call_output":
        output = item.get("output")
        if isinstance(output, list):  # input_text parts
            output = "".join(p.get("text", "") for p in output if isinstance(p, dict))
        if not isinstance(output, str):
            raise ValueError(f"{where}.output: text, or a list of input_text parts")
        out.append({"role": "tool", "tool_call_id": call_id, "content": output})
        return
    name, arguments = item.get("name"), item.get("arguments")
    if not isinstance(name, str) or not name or not isinstance(arguments, str):
        raise ValueError(f"{where}: a function_call item needs its name and arguments (a JSON string)")
    try:
        args = json.loads(arguments)
    except ValueError:
        args = arguments
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
    if out and out[-1]["role"] == "assistant":
        out[-1].setdefault("tool_calls", []).append(call)
    else:
        out.append({"role": "assistant", "content": "", "tool_calls": [call]})


def function_call_item(call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    """A parsed call (OpenAI's chat shape) as a Responses output item."""
    return {
        "type": "function_call",
        "id": "fc_" + call["id"].removeprefix("call_"),
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"],
        "status": status,
    }


def ended(final: Finished) -> tuple[str, str | None]:
    """A finished reply's status, and why it is incomplete: cut by max_output_tokens (the
    context's end included), as OpenAI says it, or completed."""
    return ("incomplete", "max_output_tokens") if final.finish_reason == "length" else ("completed", None)


def response_object(
    rid: str,
    model: str,
    text: str,
    status: str,
    usage: Usage | None,
    previous: str | None,
    msg_id: str,
    created: float,
    calls: list[dict[str, Any]] | None = None,
    why: str | None = None,
    echo: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """OpenAI's Response object; `usage` is the engine's (None: not known); `calls` the
    function calls parsed out of the reply (an output item each, after the message, which is
    left out when the reply is calls only); `why` an incomplete one's reason; `echo` what it
    says back of the request (`ResponsesRequest.echoed`; none for a kept one read back)."""
    out: list[dict[str, Any]] = []
    if status != "in_progress":
        item_status = "incomplete" if why else "completed"
        out = [message_item(msg_id, text, item_status)] if text or not calls else []
        out += [function_call_item(c) for c in calls or []]
    body: dict[str, Any] = {
        "id": rid,
        "object": "response",
        "created_at": int(created),
        "status": status,
        "model": model,
        "output": out,
        "previous_response_id": previous,
        "error": None,
        "incomplete_details": {"reason": why} if why else None,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": False,
        "tool_choice": "none",
        "tools": [],
        "temperature": None,
        "top_p": None,
        "max_output_tokens": None,
        "text": {"format": {"type": "text"}},
        "usage": None,
        **(echo or {}),
    }
    if usage is not None:
        body["usage"] = {
            "input_tokens": usage.prompt_tokens,
            "output_tokens": usage.generated_tokens,
            "total_tokens": usage.prompt_tokens + usage.generated_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
    return body


def message_item(msg_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": msg_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


class ResponseEvents:
    """The streamed events of one response, numbered as the SDK expects (a Framing of
    webui/api/generation.py). `keep` stores the finished reply before the last events go
    out, so a client that reads response.completed can go on from it at once. With a tool
    `family`, what may be a call is held back (webui/api/toolcalls.py); the message item opens
    with the first text shown, and the calls go out at the end, an output item each."""

    def __init__(
        self,
        rid: str,
        model: str,
        previous: str | None,
        keep: Callable[[str], Awaitable[None]],
        msg: str,
        family: str | None = None,
        forced: bool = False,
        echo: dict[str, Any] | None = None,
        created: float | None = None,
    ) -> None:
        self.rid, self.model, self.previous, self.keep = rid, model, previous, keep
        self.msg = msg  # the output message's id
        self.echo = echo
        self.created = time.time() if created is None else created
        self.n = 0
        self.stream = toolcalls.Stream(family, forced) if family else None
        self.opened = False  # the message item's added events went out
        self.shown = ""  # its text so far

    def _event(self, kind: str, **fields: Any) -> str:
        self.n += 1
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': self.n - 1, **fields})}\n\n"

    def _response(
        self,
        text: str,
        status: str,
        usage: Usage | None = None,
        calls: list[dict[str, Any]] | None = None,
        why: str | None = None,
    ) -> dict[str, Any]:
        return response_object(
            self.rid, self.model, text, status, usage, self.previous, self.msg, self.created, calls, why, self.echo
        )

    def _open(self) -> list[str]:
        self.opened = True
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            self._event("response.output_item.added", output_index=0, item=message_item(self.msg, "", "in_progress")),
            self._event("response.content_part.added", item_id=self.msg, output_index=0, content_index=0, part=part),
        ]

    def opening(self) -> list[str]:
        resp = self._response("", "in_progress")
        out = [self._event("response.created", response=resp), self._event("response.in_progress", response=resp)]
        return out if self.stream else [*out, *self._open()]

    def _text(self, text: str) -> list[str]:
        if not text:
            return []
        out = [] if self.opened else self._open()
        self.shown += text
        ids = {"item_id": self.msg, "output_index": 0, "content_index": 0}
        return [*out, self._event("response.output_text.delta", **ids, delta=text, logprobs=[])]

    def delta(self, i: int, ev: TextDelta) -> list[str]:
        return self._text(self.stream.feed(ev.text) if self.stream else ev.text)

    def finished(self, i: int, ev: Finished) -> list[str]:
        return []  # the closing events carry it, once the reply is kept

    def failed(self, i: int, ev: Failed) -> list[str]:
        resp = self._response("", "failed")
        # (the codes a Responses client knows: its input's fault is an invalid prompt)
        resp["error"] = {"code": "invalid_prompt" if ev.theirs else "server_error", "message": ev.message}
        return [self._event("response.failed", response=resp)]

    async def closing(self, finals: list[Finished] | None) -> list[str]:
        if finals is None:  # failed: response.failed was the last event
            return []
        (final,) = finals
        await self.keep(final.text)
        status, why = ended(final)
        out, calls = [], None
        if self.stream:
            rest, calls = self.stream.finish()
            out += self._text(rest)
            calls = [{k: v for k, v in c.items() if k != "index"} for c in calls or []]
        if self.opened or not calls:  # a reply of calls only has no message
            out += [] if self.opened else self._open()
            text = self.shown if self.stream else final.text
            part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            ids = {"item_id": self.msg, "output_index": 0, "content_index": 0}
            out += [
                self._event("response.output_text.done", **ids, text=text, logprobs=[]),
                self._event("response.content_part.done", **ids, part=part),
                self._event(
                    "response.output_item.done",
                    output_index=0,
                    item=message_item(self.msg, text, status),
                ),
            ]
        at = int(self.opened)
        for k, call in enumerate(calls or []):
            item = function_call_item(call)
            ids = {"item_id": item["id"], "output_index": at + k}
            out += [
                self._event(
                    "response.output_item.added",
                    output_index=at + k,
                    item={**item, "arguments": "", "status": "in_progress"},
                ),
                self._event("response.function_call_arguments.delta", **ids, delta=item["arguments"]),
                self._event(
                    "response.function_call_arguments.done", **ids, arguments=item["arguments"], name=item["name"]
                ),
                self._event("response.output_item.done", output_index=at + k, item=item),
            ]
        done = self._response(self.shown if self.stream else final.text, status, final.usage, calls or None, why)
        return [*out, self._event(f"response.{status}", response=done)]
