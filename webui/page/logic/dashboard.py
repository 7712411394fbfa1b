"""The Server tab's figures: model, memory, prefix cache, load, and per-minute series from the store.

Aggregates only: counts, token totals, latencies. Nothing here reads a message or a title,
so no user ever sees another's text through it. Beside the server's totals, the one who
looks sees their own usage over the same hour, and nobody else's by name. `Presence`
counts who is signed in: names seen by the page in the last few minutes, kept in memory.
Runs in Gradio's worker threads (the Server tab's refresh). No MLX, no Gradio.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import pandas as pd

from radixchat.core.engine.models import as_engines
from radixchat.core.platform.memory import bound_text, process_rss, size_text
from radixchat.core.seam.protocol import (
    DiskCacheStats,
    EngineClient,
    Engines,
    MlxMemoryStats,
    PrefixCacheStats,
)

if TYPE_CHECKING:
    from radixchat.core.store import Store, User
    from radixchat.core.store.report import StatsBucket

SIGNED_IN_WINDOW_S = 300.0
WINDOW_S, BUCKET_S = 3600.0, 60.0  # the plots' titles say "per minute (last hour)"


def plural(n: int, word: str, many: str | None = None) -> str:
    """ "1 user", "2 users", "1,024 tokens"."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


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
    ttft: pd.DataFrame  # time, ms, series ("p50" / "p95" / "your p50")
    # the plots' time axis, the whole window even where it holds no point (seconds on the
    # same naive local clock as the frames' times, as Gradio's plots want an x_lim)
    x_lim: tuple[float, float]
    usage: str = ""  # Markdown: the last hour, yours beside everyone's


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "n/a"


def _local(ts: float) -> pd.Timestamp:
    return pd.Timestamp(datetime.fromtimestamp(ts))  # the server's local time


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f} ms"


def _usage_cells(b: StatsBucket) -> list[str]:
    return [
        f"{plural(b.requests, 'request')} ({b.errors:,} failed)",
        f"{plural(b.prompt_tokens, 'prompt token')}, {b.generated_tokens:,} generated",
        "n/a" if b.cache_hit_ratio is None else f"{100 * b.cache_hit_ratio:.0f}%",
        f"p50 {_ms(b.ttft_p50_ms)}, p95 {_ms(b.ttft_p95_ms)}",
    ]


def usage_table(mine: StatsBucket, everyone: StatsBucket) -> str:
    """The last hour: one user's requests beside all of them (no one else's apart)."""
    rows = ["Requests", "Tokens", "Prompt tokens from the cache", "Time to first token"]
    lines = ["| Last hour | You | Everyone |", "|---|---|---|"]
    for name, a, b in zip(rows, _usage_cells(mine), _usage_cells(everyone)):
        lines.append(f"| {name} | {a} | {b} |")
    return "\n".join(lines)


def disk_line(disk: DiskCacheStats | None) -> str:
    """The prefix cache's disk tier (core/cache/disk/tier.py's summary), or that it is off."""
    if not disk:
        return "| Disk cache | off (`--cache-disk-bytes`) |"
    loads = disk.loads
    read_ms = 1000 * (disk.read_s + disk.load_s) / loads if loads else None
    line = (
        f"| Disk cache | {_bytes(disk.bytes)} of {_bytes(disk.budget)} in "
        f"{plural(disk.files, 'file')}; {plural(loads, 'hit')} from disk since start "
        f"({plural(disk.load_tokens, 'token')}"
        f"{f', {read_ms:,.1f} ms each' if read_ms is not None else ''}), "
        f"{plural(disk.writes, 'write')}"
    )
    if disk.dropped:
        line += f"; {plural(disk.dropped, 'entry', 'entries')} dropped (unreadable or corrupt: see the log)"
    return line + " |"


def dashboard(
    engine: Engines | EngineClient,
    store: Store,
    presence: Presence,
    *,
    window_s: float = WINDOW_S,
    bucket_s: float = BUCKET_S,
    you: User | None = None,
) -> Dashboard:
    """The Server tab; with `you` (a User), that user's own figures beside the server's."""
    summary = summary_table(engine, store, presence)
    now = time.time()
    buckets = store.stats(window_s=window_s, bucket_s=bucket_s, now=now)
    rows, ttft = [], []
    for b in buckets:
        t = _local(b.start)
        rows.append((t, b.requests - b.errors, "answered"))
        rows.append((t, b.errors, "failed"))
        if b.ttft_p50_ms is not None:
            assert b.ttft_p95_ms is not None  # percentiles of the same latencies: both or neither
            ttft.append((t, round(b.ttft_p50_ms, 1), "p50"))  # the axis shows as many digits
            ttft.append((t, round(b.ttft_p95_ms, 1), "p95"))
    usage = ""
    if you is not None:
        for b in store.stats(window_s=window_s, bucket_s=bucket_s, now=now, user=you):
            if b.ttft_p50_ms is not None:
                ttft.append((_local(b.start), round(b.ttft_p50_ms, 1), "your p50"))
        usage = usage_table(store.usage(window_s=window_s, now=now, user=you), store.usage(window_s=window_s, now=now))
    first = buckets[0].start if buckets else now - window_s
    return Dashboard(
        summary=summary,
        requests=pd.DataFrame(rows, columns=["time", "count", "series"]),
        ttft=pd.DataFrame(ttft, columns=["time", "ms", "series"]),
        x_lim=(_local(first).value / 1e9, _local(now).value / 1e9),
        usage=usage,
    )


def summary_table(engine: Engines | EngineClient, store: Store, presence: Presence) -> str:
    """The table at the top of the tab (Markdown): the model, the engine, the caches, who is
    signed in, and the all-time totals; `engine` is the page's (the first model's) or the
    served models, which get a line of their own when there are several."""
    engines = as_engines(engine)
    engine = engines.default
    s = engine.stats()
    totals = store.totals()
    lines = ["| | now |", "|---|---|"]
    m = engine.info
    lines.append(
        f"| Model | `{m.model_id}`: {m.num_params / 1e6:,.1f}M parameters, {m.dtype}, "
        f"context {m.context_length:,} tokens{_kv_bits(m.kv_bits, m.kv_batch_codes, m.kv_group)} |"
    )
    # the same two counts as /health and /metrics (core.seam.protocol.EngineStats)
    lines.append(
        f"| Engine | {'running' if s.alive else 'stopped'}: {plural(s.running, 'running request')}, "
        f"{s.waiting:,} waiting |"
    )
    if s.batch_tokens:
        lines.append(
            f"| Batch | {s.running:,} in the batch; room for {plural(s.batch_tokens, 'token')} "
            f"of running sequences ({_bytes(s.kv_bytes_per_token)} each) in the K/V budget of "
            f"{_bytes(s.kv_budget)}, at most {plural(s.max_batch, 'sequence')} |"
        )
    if s.memory is not None:
        lines.append(memory_line(engines, s.memory))
    if len(engines.served()) > 1:
        lines.append(models_line(engines))
    lines.extend(cache_lines(s.prefix_cache, totals))
    lines.append(disk_line(s.disk_cache))
    spec = s.speculation
    if spec is not None:
        lines.append(
            f"| Speculation | drafts of up to {plural(spec.max_draft, 'token')}: "
            f"{_pct(spec.accepted, spec.drafted)} of {plural(spec.drafted, 'draft token')} "
            f"accepted since start |"
        )
    lines.append(
        f"| Users signed in | {plural(presence.count(), 'user')} (active in the last "
        f"{plural(round(presence.window_s / 60), 'minute')}) |"
    )
    lines.append(
        f"| All time | {plural(totals['requests'], 'request')} ({totals['errors']:,} failed), "
        f"{totals['prompt_tokens']:,} prompt and {totals['generated_tokens']:,} generated tokens, "
        f"{plural(totals['users'], 'user')}, {plural(totals['conversations'], 'conversation')} |"
    )
    return "\n".join(lines)


def _kv_bits(bits: int, batch_too: bool, group: int) -> str:
    holders = "the prefix cache and the decoding batch hold" if batch_too else "the prefix cache holds"
    scale = f", a scale per {group} numbers" if group else ""
    return "" if bits == 16 else f"; K/V at {bits} bits{scale} (--kv-bits: {holders} it at that size)"


def memory_line(engines: Engines, mem: MlxMemoryStats) -> str:
    """The process's memory now and what it will take (the engines' `memory_bound`, where
    they run in this process), and what MLX holds."""
    rss = process_rss()
    now = f"{size_text(rss[0])} resident now, {size_text(rss[1])} at most so far; " if rss else ""
    bound = engines.memory_bound()
    will = f"the process will take {bound_text(bound)}; " if bound else ""
    return (
        f"| Memory | {now}{will}MLX holds {size_text(mem.active)} in arrays (at most {size_text(mem.peak)} so far) and "
        f"{size_text(mem.cache)} of freed buffers |"
    )


def models_line(engines: Engines) -> str:
    """Every served model: loaded or not, what its weights and K/V budget take, its requests."""
    loaded = {e.info.model_id: e for e in engines.serving()}
    parts = []
    for m in engines.served():
        engine = loaded.get(m.model_id)
        if engine is None:
            parts.append(f"`{m.model_id}`: not loaded (loads on its first request)")
            continue
        s = engine.stats()
        parts.append(
            f"`{m.model_id}`: loaded, {_bytes(engine.info.weights_bytes)} of weights and "
            f"{_bytes(s.kv_budget)} of K/V budget, {s.running:,} running, {s.waiting:,} waiting"
        )
    return "| Models | " + "; ".join(parts) + " |"


def cache_lines(cache: PrefixCacheStats | None, totals: dict[str, int]) -> list[str]:
    """The prefix cache in memory (core/cache/radix.py's figures), or that it is off."""
    if not cache:
        return ["| Prefix cache | off |"]
    lookups = cache.hits + cache.misses
    return [
        f"| Prefix cache | {_bytes(cache.bytes)} of {_bytes(cache.budget)} "
        f"({_pct(cache.bytes, cache.budget)} full), "
        f"{plural(cache.cached_tokens, 'token')} in {plural(cache.nodes, 'node')}, "
        f"{plural(cache.evictions, 'eviction')} |",
        f"| Cache hits | {_pct(cache.hits, lookups)} of {plural(lookups, 'lookup')} "
        f"since start; {_pct(totals['cached_tokens'], totals['prompt_tokens'])} of all prompt "
        "tokens served from the cache |",
    ]
