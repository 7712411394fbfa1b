"""The Responses API's request and reply shapes: `ResponsesRequest` (its fields under the
one rule of webui/api/fields.py), the Response object, and `ResponseEvents`, the SSE
events of one streamed response as the SDK reads them (response.created ...
output_text.delta ... response.completed), framed for the stream loop of
webui/api/generation.py. What the routes do with them, and the store, is
webui/api/responses.py's. Runs on the server's event loop; no MLX.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from radixchat.core.engine.requests import Failed, Finished, TextDelta
from radixchat.webui.api.fields import FIELDS, check_fields, with_defaults

ROLES = ("user", "assistant", "system", "developer")


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str
    input: str | list[dict] = Field(min_length=1)
    instructions: str | None = None
    stream: bool = False
    previous_response_id: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None
    store: bool = True
    text: dict | None = None

    @model_validator(mode="before")
    @classmethod
    def _fields(cls, data):
        return check_fields(data, FIELDS["responses"], "Responses")

    def sampling(self, defaults: dict | None) -> dict:
        """The engine's sampling fields; `defaults` fill what the request left out."""
        return {
            **with_defaults(self.temperature, self.top_p, defaults),
            "max_tokens": self.max_output_tokens,
            "seed": self.seed,
            "json_schema": self.schema(),
        }

    def messages(self) -> list[dict]:
        """This turn's input as chat messages."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        out = []
        for item in self.input:
            if item.get("type", "message") != "message" or item.get("role") not in ROLES:
                raise ValueError("input: only messages (user, assistant, system, developer) are supported")
            content = item.get("content")
            if isinstance(content, list):
                parts = []
                for p in content:
                    if p.get("type") not in ("input_text", "output_text", "text"):
                        raise ValueError(f"input: this model takes text only (got a {p.get('type')} part)")
                    parts.append(p.get("text", ""))
                content = "".join(parts)
            if not isinstance(content, str):
                raise ValueError("input: a message's content is text or a list of text parts")
            role = "system" if item["role"] == "developer" else item["role"]
            out.append({"role": role, "content": content})
        return out

    def schema(self) -> dict | None:
        fmt = (self.text or {}).get("format") or {"type": "text"}
        kind = fmt.get("type")
        if kind == "text":
            return None
        if kind == "json_object":
            return {"type": "object"}
        if kind == "json_schema" and isinstance(fmt.get("schema"), dict):
            return fmt["schema"]
        raise ValueError("text.format: text, json_object or json_schema (with its schema)")


def response_object(
    rid: str, model: str, text: str, status: str, usage, previous: str | None, msg_id: str, created: float
) -> dict:
    """OpenAI's Response object; `usage` is the engine's (None: not known)."""
    out = [] if status == "in_progress" else [message_item(msg_id, text, "completed")]
    body = {
        "id": rid,
        "object": "response",
        "created_at": int(created),
        "status": status,
        "model": model,
        "output": out,
        "previous_response_id": previous,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": False,
        "tool_choice": "none",
        "tools": [],
        "temperature": None,
        "top_p": None,
        "text": {"format": {"type": "text"}},
        "usage": None,
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


def message_item(msg_id: str, text: str, status: str) -> dict:
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
    out, so a client that reads response.completed can go on from it at once."""

    def __init__(self, rid: str, model: str, previous: str | None, keep: Callable[[str], Awaitable[None]], msg: str):
        self.rid, self.model, self.previous, self.keep = rid, model, previous, keep
        self.msg = msg  # the output message's id
        self.created = time.time()
        self.n = 0

    def _event(self, kind: str, **fields) -> str:
        self.n += 1
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': self.n - 1, **fields})}\n\n"

    def _response(self, text: str, status: str, usage=None) -> dict:
        return response_object(self.rid, self.model, text, status, usage, self.previous, self.msg, self.created)

    def opening(self) -> list[str]:
        resp = self._response("", "in_progress")
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            self._event("response.created", response=resp),
            self._event("response.in_progress", response=resp),
            self._event("response.output_item.added", output_index=0, item=message_item(self.msg, "", "in_progress")),
            self._event("response.content_part.added", item_id=self.msg, output_index=0, content_index=0, part=part),
        ]

    def delta(self, i: int, ev: TextDelta) -> list[str]:
        return [
            self._event(
                "response.output_text.delta",
                item_id=self.msg,
                output_index=0,
                content_index=0,
                delta=ev.text,
                logprobs=[],
            )
        ]

    def finished(self, i: int, ev: Finished) -> list[str]:
        return []  # the closing events carry it, once the reply is kept

    def failed(self, i: int, ev: Failed) -> list[str]:
        resp = self._response("", "failed")
        resp["error"] = {"code": "server_error", "message": ev.message}
        return [self._event("response.failed", response=resp)]

    async def closing(self, finals: list[Finished] | None) -> list[str]:
        if finals is None:  # failed: response.failed was the last event
            return []
        (final,) = finals
        await self.keep(final.text)
        text = final.text
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        ids = {"item_id": self.msg, "output_index": 0, "content_index": 0}
        return [
            self._event("response.output_text.done", **ids, text=text, logprobs=[]),
            self._event("response.content_part.done", **ids, part=part),
            self._event("response.output_item.done", output_index=0, item=message_item(self.msg, text, "completed")),
            self._event("response.completed", response=self._response(text, "completed", final.usage)),
        ]
