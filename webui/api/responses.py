"""OpenAI's Responses API (`POST /v1/responses`, `GET /v1/responses/{id}`) over the same
engine, with `previous_response_id` kept in the store as the user's conversations.

Current OpenAI SDKs and agent frameworks default to this API. What is served: text input
(a string, or messages whose content is text or input_text parts), `instructions` (the
system message of this turn), streaming (the event sequence the SDK reads:
response.created ... output_text.delta ... response.completed), `max_output_tokens`,
`temperature`, `top_p`, `text.format` (json_object / json_schema through the same
constrained decoding as chat), and `previous_response_id`. Everything else that would
change the reply (tools, reasoning, images) is refused with a 400 that names it.

With `store` (the default) and a signed-in key, each response is two messages of a
conversation of that user (the input, then the reply), so the page shows it too, and its
id names that conversation and message: `resp_<conversation>_<message>`. A previous id
continues its conversation; another user's id, or one that does not exist, is "not
found", the same answer. Continuing from an earlier response than the last starts a new
conversation with the history up to it (the old one is left as it was). With --no-auth
there is no user to keep them under: `previous_response_id` is refused.
Runs on the server's event loop; the store is called in worker threads.
"""

from __future__ import annotations

import json
import re
import time

from pydantic import BaseModel, ConfigDict, Field, model_validator

from radixchat.core.store import Store
from radixchat.core.store.types import StoreError, User
from radixchat.webui.api.errors import ApiError
from radixchat.webui.api.schema import check_fields, new_id, with_defaults

# what each field does here (the one rule of webui/api/schema.py)
FIELDS = {
    "model": "used",
    "input": "used",
    "instructions": "used",
    "stream": "used",
    "previous_response_id": "used",
    "max_output_tokens": "used",
    "temperature": "used",
    "top_p": "used",
    "store": "used",
    "text": "used",
    "seed": "used",
    "user": "ignored",
    "metadata": "ignored",
    "service_tier": "ignored",
    "truncation": "ignored",
    "parallel_tool_calls": "ignored",
    "safety_identifier": "ignored",
    "prompt_cache_key": "ignored",
    "tools": "refused",
    "tool_choice": "refused",
    "reasoning": "refused",
    "include": "refused",
    "background": "refused",
    "conversation": "refused",
    "prompt": "refused",
    "top_logprobs": "refused",
    "max_tool_calls": "refused",
    "stream_options": "ignored",
}
ID = re.compile(r"^resp_(\d+)_(\d+)$")


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
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
        return check_fields(data, FIELDS, "Responses")

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
            if item.get("type", "message") != "message" or item.get("role") not in (
                "user",
                "assistant",
                "system",
                "developer",
            ):
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


def parse_id(response_id: str) -> tuple[int, int] | None:
    m = ID.match(response_id)
    return (int(m.group(1)), int(m.group(2))) if m else None


def continue_from(store: Store, user: User, response_id: str) -> tuple[int, list[dict]]:
    """(the conversation to go on in, its messages up to and with that response's reply);
    store thread. Another user's id and an unknown one get the same 404."""
    gone = ApiError(404, f"response {response_id!r} not found", code="not_found", param="previous_response_id")
    ids = parse_id(response_id)
    if ids is None:
        raise gone
    conv, msg = ids
    try:
        history = store.history(user, conv)
    except StoreError:
        raise gone from None
    at = next((i for i, m in enumerate(history) if m.id == msg and m.role == "user"), None)
    if at is None:
        raise gone
    end = at + 1 + (at + 1 < len(history) and history[at + 1].role == "assistant")
    kept = [{"role": m.role, "content": m.content} for m in history[:end]]
    if end < len(history):  # it went on after that response: branch, leaving it as it was
        conv = store.create_conversation(user, store.get_conversation(user, conv).title).id
        for m in kept:
            store.append_message(user, conv, m["role"], m["content"])
    return conv, kept


def start_turn(store: Store, user: User, conv: int | None, turn: list[dict]) -> tuple[int, int]:
    """Keep this turn's input in the user's conversation (a new one without `conv`);
    (conversation, the last input message's id). Store thread."""
    if conv is None:
        title = next((m["content"] for m in turn if m["role"] == "user"), "Response")[:60].strip() or "Response"
        conv = store.create_conversation(user, title).id
    last = None
    for m in turn:
        if m["role"] in ("user", "assistant"):
            last = store.append_message(user, conv, m["role"], m["content"])
    return conv, last.id


def response_object(
    rid: str, model: str, text: str, status: str, usage, previous: str | None, msg_id: str, created: float
) -> dict:
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


class Events:
    """The streamed events of one response, numbered as the SDK expects."""

    def __init__(self, rid: str, model: str, previous: str | None):
        self.rid, self.model, self.previous = rid, model, previous
        self.msg = new_id("msg")
        self.created = time.time()
        self.n = 0

    def _event(self, kind: str, **fields) -> str:
        self.n += 1
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': self.n - 1, **fields})}\n\n"

    def start(self):
        resp = response_object(self.rid, self.model, "", "in_progress", None, self.previous, self.msg, self.created)
        yield self._event("response.created", response=resp)
        yield self._event("response.in_progress", response=resp)
        yield self._event("response.output_item.added", output_index=0, item=message_item(self.msg, "", "in_progress"))
        yield self._event(
            "response.content_part.added",
            item_id=self.msg,
            output_index=0,
            content_index=0,
            part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
        )

    def delta(self, text: str) -> str:
        return self._event(
            "response.output_text.delta", item_id=self.msg, output_index=0, content_index=0, delta=text, logprobs=[]
        )

    def end(self, rid: str, text: str, usage):
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        yield self._event(
            "response.output_text.done", item_id=self.msg, output_index=0, content_index=0, text=text, logprobs=[]
        )
        yield self._event("response.content_part.done", item_id=self.msg, output_index=0, content_index=0, part=part)
        yield self._event("response.output_item.done", output_index=0, item=message_item(self.msg, text, "completed"))
        yield self._event(
            "response.completed",
            response=response_object(rid, self.model, text, "completed", usage, self.previous, self.msg, self.created),
        )

    def failed(self, message: str) -> str:
        resp = response_object(self.rid, self.model, "", "failed", None, self.previous, self.msg, self.created)
        resp["error"] = {"code": "server_error", "message": message}
        return self._event("response.failed", response=resp)
