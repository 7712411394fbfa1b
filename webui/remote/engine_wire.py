"""The engine seam as JSON: what a worker (webui/remote/worker.py) and a front end's remote engine
(webui/remote/remote_engine.py) send each other over HTTP.

Requests travel as their pydantic models dump them (`request_body`, `request_of`); the
events of one request as newline-delimited JSON, one typed line each (`event_line`,
`event_of`): an `accepted` line first (the request's id and prompt tokens), then `delta`
lines, then one `finished` or `failed`; `ping` lines keep a quiet stream provably alive.
`ModelInfo` and `EngineStats` go as their dataclasses' fields (`info_of`, `stats_of`
rebuild them, ignoring fields a newer worker may add).

Through a router (SGLang's smg, which forwards only OpenAI's and SGLang's own routes) a
submission goes as POST ROUTED_PATH, SGLang's native /generate: `routed_body` wraps the
request under `radixchat` beside the `model` smg routes by and `stream`, which makes smg pass
the answer through as it comes (smg keeps fields it does not know, and adds some of its own,
which `routed_request_of` ignores). smg drops the X-Radixchat-User header it hashes on, so
the owner travels in the request itself, trusted by a worker only with the service key.

Left to others: the HTTP on either side, who may call. No threads or state here: plain
functions, safe from any thread. No MLX.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from radixchat.core.seam.protocol import (
    DiskCacheStats,
    EngineStats,
    MlxMemoryStats,
    ModelInfo,
    PrefixCacheStats,
    ShardStats,
    SpeculationStats,
)
from radixchat.core.seam.requests import (
    ChatRequest,
    Failed,
    Finished,
    PromptRequest,
    TextDelta,
    TokenLogprob,
    Usage,
)

SERVICE_USER_HEADER = "x-radixchat-user"  # a request's owner, for a router that hashes on it
ROUTED_PATH = "/generate"  # a route smg forwards to its workers (it answers 404 for /engine/*)
ROUTED_WORKER_HEADER = "x-smg-routed-worker-id"  # smg's answer: the worker it chose (its URL)


@dataclass(frozen=True)
class WireCard:
    """A model's card as a worker describes it: the fields of core.models.catalog.Card,
    which webui/ does not import (the page reads these by name)."""

    name: str
    size: str = ""
    license: str = ""
    link: str = ""
    note: str = ""
    sampling: dict[str, float] = field(default_factory=dict)


def request_body(request: ChatRequest | PromptRequest) -> dict[str, Any]:
    kind = "prompt" if isinstance(request, PromptRequest) else "chat"
    return {"kind": kind, "request": request.model_dump(mode="json", exclude_defaults=True)}


def request_of(body: dict[str, Any]) -> ChatRequest | PromptRequest:
    """The request a body names; pydantic's ValidationError (or ValueError) when it is bad."""
    kind = body.get("kind") if isinstance(body, dict) else None
    if kind not in ("chat", "prompt"):
        raise ValueError("kind: 'chat' or 'prompt'")
    if kind == "prompt":
        return PromptRequest.model_validate(body.get("request"))
    return ChatRequest.model_validate(body.get("request"))


def routed_body(request: ChatRequest | PromptRequest, model: str) -> dict[str, Any]:
    return {"model": model, "stream": True, "radixchat": request_body(request)}


def routed_request_of(body: dict[str, Any]) -> ChatRequest | PromptRequest:
    """The request a routed body carries; ValueError when it carries none."""
    inner = body.get("radixchat") if isinstance(body, dict) else None
    if not isinstance(inner, dict):
        raise ValueError("radixchat: the engine request (this route serves radixchat front ends)")
    return request_of(inner)


def _logprobs(items: list[dict[str, Any]] | None) -> list[TokenLogprob] | None:
    if items is None:
        return None
    return [TokenLogprob(i["token"], i["logprob"], [tuple(t) for t in i.get("top", [])]) for i in items]


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def event_line(ev: TextDelta | Finished | Failed) -> bytes:
    if isinstance(ev, TextDelta):
        body = {"type": "delta", **asdict(ev)}
    elif isinstance(ev, Finished):
        body = {"type": "finished", **asdict(ev)}
    else:
        body = {"type": "failed", **asdict(ev)}
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def control_line(kind: str, **fields: Any) -> bytes:
    return json.dumps({"type": kind, **fields}, separators=(",", ":")).encode() + b"\n"


def event_of(data: dict[str, Any]) -> TextDelta | Finished | Failed:
    """The event a `delta`, `finished` or `failed` line carries; ValueError for another."""
    kind = data.get("type")
    if kind == "delta":
        return TextDelta(data["text"], _logprobs(data.get("logprobs")))
    usage = Usage(**_known(Usage, data.get("usage") or {}))
    if kind == "finished":
        return Finished(
            data["text"], data["finish_reason"], usage, _logprobs(data.get("logprobs")), data.get("stop_sequence")
        )
    if kind == "failed":
        return Failed(data["message"], usage)
    raise ValueError(f"not an event: {kind!r}")


def info_of(data: dict[str, Any]) -> ModelInfo:
    data = _known(ModelInfo, data)
    card = data.get("card")
    data["card"] = WireCard(**_known(WireCard, card)) if card else None
    return ModelInfo(**data)


_NESTED = {
    "prefix_cache": PrefixCacheStats,
    "disk_cache": DiskCacheStats,
    "shards": ShardStats,
    "speculation": SpeculationStats,
    "memory": MlxMemoryStats,
}


def stats_of(data: dict[str, Any]) -> EngineStats:
    data = _known(EngineStats, data)
    for name, cls in _NESTED.items():
        if data.get(name) is not None:
            data[name] = cls(**_known(cls, data[name]))
    return EngineStats(**data)
