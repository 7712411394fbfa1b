"""The Server tab's figures: model, prefix cache, load, and per-minute series from the store.

Aggregates only: counts, token totals, latencies. Nothing here reads a message or a title,
so no user ever sees another's text through it. `Presence` counts who is signed in: names
seen by the page in the last few minutes, kept in memory. No MLX, no Gradio.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime

import pandas as pd

SIGNED_IN_WINDOW_S = 300.0


class Presence:
    """Who used the page lately (any event counts, the Server tab's refresh too)."""

    def __init__(self, window_s: float = SIGNED_IN_WINDOW_S):
        self.window_s = window_s
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def seen(self, name: str) -> None:
        with self._lock:
            self._seen[name] = time.monotonic()

    def count(self) -> int:
        cutoff = time.monotonic() - self.window_s
        with self._lock:
            for name in [n for n, t in self._seen.items() if t < cutoff]:
                del self._seen[name]
            return len(self._seen)


@dataclass
class Dashboard:
    summary: str  # Markdown
    requests: pd.DataFrame  # time, count, series ("answered" / "failed")
    ttft: pd.DataFrame  # time, ms, series ("p50" / "p95")


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "n/a"


def dashboard(engine, store, presence: Presence, *, window_s: float = 3600.0,
              bucket_s: float = 60.0) -> Dashboard:
    s = engine.stats()
    m = engine.loaded
    cache = s.get("prefix_cache")
    totals = store.totals()
    lines = ["| | now |", "|---|---|"]
    if m is not None:
        lines.append(f"| Model | `{m.model_id}`: {m.num_params / 1e6:,.1f}M parameters, {m.dtype}, "
                     f"context {m.context_length:,} tokens |")
    lines.append(f"| Engine | {'running' if s['alive'] else 'stopped'}: {s['active']} active requests, "
                 f"{max(0, s['inflight'] - s['active'])} waiting |")
    if s.get("batch_tokens"):
        lines.append(f"| Batch | {s.get('running', 0)} decoding; room for {s['batch_tokens']:,} tokens of running "
                     f"sequences ({_bytes(s['kv_bytes_per_token'])} each) in the K/V budget of "
                     f"{_bytes(s['kv_budget'])}, at most {s['max_batch']} sequences |")
    if cache:
        lookups = cache.get("hits", 0) + cache.get("misses", 0)
        lines.append(f"| Prefix cache | {_bytes(cache.get('bytes', 0))} of {_bytes(cache.get('budget', 0))} "
                     f"({_pct(cache.get('bytes', 0), cache.get('budget', 0))} full), "
                     f"{cache.get('cached_tokens', 0):,} tokens in {cache.get('nodes', 0):,} nodes, "
                     f"{cache.get('evictions', 0):,} evictions |")
        lines.append(f"| Cache hits | {_pct(cache.get('hits', 0), lookups)} of {lookups:,} lookups since start; "
                     f"{_pct(totals['cached_tokens'], totals['prompt_tokens'])} of all prompt tokens "
                     "served from the cache |")
    else:
        lines.append("| Prefix cache | off |")
    lines.append(f"| Users signed in | {presence.count()} (active in the last "
                 f"{presence.window_s / 60:.0f} minutes) |")
    lines.append(f"| All time | {totals['requests']:,} requests ({totals['errors']:,} failed), "
                 f"{totals['prompt_tokens']:,} prompt and {totals['generated_tokens']:,} generated tokens, "
                 f"{totals['users']:,} users, {totals['conversations']:,} conversations |")

    buckets = store.stats(window_s=window_s, bucket_s=bucket_s)
    rows, ttft = [], []
    for b in buckets:
        t = pd.Timestamp(datetime.fromtimestamp(b.start))  # the server's local time
        rows.append((t, b.requests - b.errors, "answered"))
        rows.append((t, b.errors, "failed"))
        if b.ttft_p50_ms is not None:
            ttft.append((t, b.ttft_p50_ms, "p50"))
            ttft.append((t, b.ttft_p95_ms, "p95"))
    return Dashboard(
        summary="\n".join(lines),
        requests=pd.DataFrame(rows, columns=["time", "count", "series"]),
        ttft=pd.DataFrame(ttft, columns=["time", "ms", "series"]),
    )
