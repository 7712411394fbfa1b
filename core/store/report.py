"""Shaping what the store read: conversation exports and the dashboard's time buckets.

Pure functions over rows already fetched (and already checked for ownership) by
core.store; nothing here opens a database. Drawing the dashboard is webui's job.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixchat.core.store.types import Conversation, Message

EXPORT_FORMAT = "radixchat.conversation/1"
EXPORT_FORMATS = ("json", "md")


def iso(ts: float | None) -> str | None:
    """Unix seconds as ISO 8601 UTC, to the second (exports are for people and other tools)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def export_json(conv: Conversation, messages: list[Message], owner: str) -> str:
    doc = {
        "format": EXPORT_FORMAT,
        "id": conv.id,
        "owner": owner,
        "title": conv.title,
        "system_prompt": conv.system_prompt,
        "created": iso(conv.created),
        "updated": iso(conv.updated),
        "archived": iso(conv.archived),
        "model": conv.model,  # None: the server's first model
        "messages": [{"id": m.id, "role": m.role, "content": m.content, "created": iso(m.created)} for m in messages],
    }
    return json.dumps(doc, ensure_ascii=False, indent=2) + "\n"


def export_markdown(conv: Conversation, messages: list[Message], owner: str) -> str:
    lines = [
        f"# {conv.title}",
        "",
        f"*{owner}, started {iso(conv.created)}, last message {iso(conv.updated)}"
        + (", archived" if conv.archived is not None else "")
        + "*",
        "",
    ]
    if conv.system_prompt:
        lines += ["## System", "", conv.system_prompt, ""]
    for m in messages:
        lines += [f"## {m.role.capitalize()}", "", m.content, ""]
    return "\n".join(lines)


@dataclass(frozen=True)
class StatsBucket:
    """One time bucket of the dashboard. Percentiles are None where no request had a first token."""

    start: float  # Unix seconds, a multiple of the bucket width
    requests: int
    errors: int
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    cache_hit_ratio: float | None  # cached prompt tokens / prompt tokens; None with no prompts
    prompt_tokens: int
    generated_tokens: int
    decode_tps: float | None  # mean over the bucket's requests that decoded anything

    def as_dict(self) -> dict:
        return asdict(self)


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not sorted_values:
        return None
    pos = (len(sorted_values) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def buckets(rows: Iterable[tuple], start: float, end: float, width: float) -> list[StatsBucket]:
    """Every bucket from the one holding `start` to the one holding `end`, empty ones included,
    so a chart's time axis has no gaps. Rows are (created, ttft_ms, prompt_tokens,
    cached_tokens, generated_tokens, decode_tps, failed)."""
    first = math.floor(start / width)
    n = math.floor(end / width) - first + 1
    acc = [{"n": 0, "err": 0, "ttft": [], "prompt": 0, "cached": 0, "gen": 0, "tps": []} for _ in range(n)]
    for created, ttft, prompt, cached, gen, tps, failed in rows:
        i = math.floor(created / width) - first
        if not 0 <= i < n:
            continue
        a = acc[i]
        a["n"] += 1
        a["err"] += bool(failed)
        if ttft is not None:
            a["ttft"].append(ttft)
        a["prompt"] += prompt
        a["cached"] += cached
        a["gen"] += gen
        if tps and gen:
            a["tps"].append(tps)
    out = []
    for i, a in enumerate(acc):
        ttft = sorted(a["ttft"])
        out.append(
            StatsBucket(
                start=(first + i) * width,
                requests=a["n"],
                errors=a["err"],
                ttft_p50_ms=percentile(ttft, 0.50),
                ttft_p95_ms=percentile(ttft, 0.95),
                cache_hit_ratio=a["cached"] / a["prompt"] if a["prompt"] else None,
                prompt_tokens=a["prompt"],
                generated_tokens=a["gen"],
                decode_tps=sum(a["tps"]) / len(a["tps"]) if a["tps"] else None,
            )
        )
    return out
