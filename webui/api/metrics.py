"""Prometheus metrics for /metrics, through prometheus_client on a registry of our own.

Named as vLLM names its own under a `radixchat:` prefix (`vllm:time_to_first_token_seconds`
is `radixchat:time_to_first_token_seconds` here), so dashboards built for vLLM or SGLang
need only the prefix changed; docs/grafana-radixchat.json is one for these. Totals are
counters, times are histograms from 1 ms, and every series carries `model_name`.

Request outcomes, token counts and latency histograms are observed once per request, in
the engine's output thread as it ends, by the request's RequestEnd (webui/request_end.py),
for the API and the page alike; refusals (4xx, 429, 503) are counted by reason by whoever
refused: the API's error handlers (webui/api/errors.py) and the page. Running and waiting
requests, MLX's memory (as the engine thread read it after its last step) and the prefix
cache's figures are read from the engine at scrape time, in the thread serving /metrics. No
MLX here: only the seam's stats() and info.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from radixchat.core.engine.models import as_engines
from radixchat.core.seam.requests import Failed, Finished

if TYPE_CHECKING:
    from radixchat.core.seam.protocol import EngineClient, Engines, EngineStats

P = "radixchat:"
# from 1 ms (a cached prompt's first token on a small model) to minutes (a long queue)
_TIME_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    320.0,
)


class _EngineCollector:
    """Scrape-time figures of every loaded model's engine: what runs and waits now, and the
    prefix cache's own counters; each family has one sample per model (and result)."""

    def __init__(self, engines: Callable[[], Sequence[EngineClient]]) -> None:
        self.engines = engines

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        for engine in self.engines():
            model = engine.info.model_id
            for kind, name, help_, value, extra in _figures(engine.stats()):
                fam = families.get(name)
                if fam is None:
                    fam = families[name] = kind(P + name, help_, labels=["model_name", *extra])
                fam.add_metric([model, *extra.values()], value)
        yield from families.values()


# one figure of an engine: (family kind, name, help, value, extra labels)
Figure = tuple[type[GaugeMetricFamily] | type[CounterMetricFamily], str, str, float, dict[str, str]]


def gauge(name: str, help_: str, value: float, **extra: str) -> Figure:
    return GaugeMetricFamily, name, help_, value, extra


def counter(name: str, help_: str, value: float, **extra: str) -> Figure:
    return CounterMetricFamily, name, help_, value, extra


def _figures(s: EngineStats) -> Iterator[Figure]:
    """One engine's figures, as (family kind, name, help, value, extra labels)."""
    yield gauge("engine_alive", "1 while the engine thread runs", int(s.alive))
    yield gauge("num_requests_running", "Requests in the engine's batch (prefilling or decoding)", s.running)
    yield gauge("num_requests_waiting", "Requests waiting for a batch slot", s.waiting)
    yield counter("num_preemptions", "Running requests paused to make room in the batch (they resume)", s.preemptions)
    yield counter("num_preempted_tokens", "Tokens the preempted requests held", s.preempted_tokens)
    for why, n in sorted(s.preemptions_by.items()):
        yield counter("preemptions_by_reason", "num_preemptions by the policy that chose them", n, reason=why)
    spec = s.speculation
    if spec is not None:  # named as vLLM names its own
        yield counter("spec_decode_num_drafts", "Drafts verified (a row's draft in one step)", spec.rows_drafting)
        yield counter("spec_decode_num_draft_tokens", "Draft tokens verified", spec.drafted)
        yield counter("spec_decode_num_accepted_tokens", "Draft tokens the model accepted", spec.accepted)
    mem = s.memory  # MLX's allocator, the process's (each model's engine reads the same counters)
    if mem is not None:
        yield gauge("mlx_active_bytes", "Bytes in MLX arrays alive: weights, K/V, the step under way", mem.active)
        yield gauge("mlx_cache_bytes", "Freed buffers MLX keeps for reuse", mem.cache)
        yield gauge("mlx_cache_limit_bytes", "What MLX's buffer cache may keep (--mlx-cache-bytes)", mem.cache_limit)
        yield gauge("mlx_peak_bytes", "The most bytes in MLX arrays since start", mem.peak)
        yield gauge("mlx_step_peak_bytes", "The largest rise within one step over what stayed alive", mem.step_peak)
    cache = s.prefix_cache
    if cache is None:
        return
    yield gauge("prefix_cache_nodes", "Radix tree nodes", cache.nodes)
    yield gauge("prefix_cache_tokens", "Tokens held by the prefix cache", cache.cached_tokens)
    yield gauge("prefix_cache_bytes", "Live K/V bytes held by the prefix cache", cache.bytes)
    yield gauge("prefix_cache_budget_bytes", "The K/V byte budget (prefix cache and running batch)", cache.budget)
    yield gauge(
        "prefix_cache_usage_perc",
        "Prefix cache bytes over the budget (0-1)",
        cache.bytes / cache.budget if cache.budget else 0.0,
    )
    yield gauge("prefix_cache_locks", "Cache paths locked by running requests", cache.locks)
    yield counter("prefix_cache_lookups", "Cache lookups by result", cache.hits, result="hit")
    yield counter("prefix_cache_lookups", "Cache lookups by result", cache.misses, result="miss")
    yield counter("prefix_cache_evictions", "Nodes evicted to fit the budget", cache.evictions)
    yield counter("prefix_cache_restore_seconds", "Time spent restoring cached prefixes", cache.restore_ms / 1e3)
    yield gauge(
        "prefix_cache_disk_tokens",
        "Tokens of the prefix cache on disk only (K/V read back on a hit)",
        cache.disk_tokens,
    )
    disk = s.disk_cache
    if disk is None:
        return
    yield gauge(
        "prefix_cache_disk_bytes", "Bytes of the prefix cache's disk tier (written or being written)", disk.bytes
    )
    yield gauge(
        "prefix_cache_disk_budget_bytes",
        "The disk tier's byte limit now (--cache-disk-bytes, or auto: it follows free space)",
        disk.budget,
    )
    yield gauge("prefix_cache_disk_files", "Entries (files) of the disk tier", disk.files)
    yield gauge("prefix_cache_disk_backlog_bytes", "Bytes waiting for the disk writer", disk.backlog_bytes)
    yield counter("prefix_cache_disk_hits", "Entries read back from disk for a request", disk.loads)
    yield counter("prefix_cache_disk_hit_tokens", "Tokens whose K/V was read back from disk", disk.load_tokens)
    yield counter(
        "prefix_cache_disk_read_seconds",
        "Time reading entries back: file read and checksum (reader thread) plus making arrays (engine thread)",
        disk.read_s + disk.load_s,
    )
    yield counter("prefix_cache_disk_writes", "Entries written to disk", disk.writes)
    yield counter("prefix_cache_disk_write_bytes", "Bytes written to disk", disk.write_bytes)
    yield counter("prefix_cache_disk_write_seconds", "Writer thread's time writing and syncing entries", disk.write_s)
    yield counter("prefix_cache_disk_evictions", "Disk entries deleted (budget, or no longer used)", disk.evicted)
    yield counter("prefix_cache_disk_dropped", "Disk entries dropped as corrupt or unreadable", disk.dropped)
    yield counter(
        "prefix_cache_disk_refused",
        "Entries not written to disk: larger than the limit or their owner's share, or no room",
        disk.refused,
    )


class Metrics:
    """The request counters and histograms, by model; `model` (the first model's id) is the
    label of what names no model: the page's requests, refusals before a model is chosen."""

    def __init__(self, engines: Engines | EngineClient) -> None:
        self.registry = r = CollectorRegistry()
        engines = as_engines(engines)
        self.model = engines.default.info.model_id
        m = ["model_name"]

        def hist(name: str, help_: str) -> Histogram:
            return Histogram(P + name, help_, m, buckets=_TIME_BUCKETS, registry=r)

        self.success = Counter(
            P + "request_success", "Requests that ended, by finish reason", m + ["finished_reason"], registry=r
        )
        self.failure = Counter(P + "request_failure", "Requests the engine failed", m, registry=r)
        self.refused = Counter(
            P + "request_refused",
            "Requests refused before generating, by reason "
            "(the error code: invalid_value, queue_full, invalid_api_key, ...)",
            m + ["reason"],
            registry=r,
        )
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens of ended requests", m, registry=r)
        self.generation_tokens = Counter(P + "generation_tokens", "Generated tokens", m, registry=r)
        self.cache_queries = Counter(
            P + "prefix_cache_queries", "Prompt tokens looked up in the prefix cache", m, registry=r
        )
        self.cache_hits = Counter(P + "prefix_cache_hits", "Prompt tokens served from the prefix cache", m, registry=r)
        self.ttft = hist("time_to_first_token_seconds", "Submit to first token")
        self.itl = hist(
            "inter_token_latency_seconds", "Time between generated tokens (each request's mean gap, once per gap)"
        )
        self.e2e = hist("e2e_request_latency_seconds", "Submit to last token")
        self.queue = hist("request_queue_time_seconds", "Submit to the step that begins its prefill")
        self.prefill = hist("request_prefill_time_seconds", "Start of prefill to first token")
        self.decode = hist("request_decode_time_seconds", "First token to last token")
        r.register(_EngineCollector(engines.serving))
        # every series exists from the start (at 0), so a dashboard's rates are not "no data"
        for metric in (
            self.failure,
            self.prompt_tokens,
            self.generation_tokens,
            self.cache_queries,
            self.cache_hits,
            self.ttft,
            self.itl,
            self.e2e,
            self.queue,
            self.prefill,
            self.decode,
        ):
            metric.labels(self.model)
        for reason in ("stop", "length", "cancelled"):
            self.success.labels(self.model, reason)

    def observe(self, final: Finished | Failed, model: str | None = None) -> None:
        """One request's end. Counters and histograms only: cheap enough for the engine's
        output thread."""
        u, model = final.usage, model or self.model
        if isinstance(final, Failed):
            self.failure.labels(model).inc()
        else:
            self.success.labels(model, final.finish_reason).inc()
        self.prompt_tokens.labels(model).inc(u.prompt_tokens)
        self.generation_tokens.labels(model).inc(u.generated_tokens)
        self.cache_queries.labels(model).inc(u.prompt_tokens)
        self.cache_hits.labels(model).inc(u.cached_tokens)
        self.e2e.labels(model).observe(u.total_ms / 1e3)
        if u.ttft_ms is None:  # ended before its first token (cancelled, failed)
            return
        self.ttft.labels(model).observe(u.ttft_ms / 1e3)
        self.queue.labels(model).observe(u.queue_ms / 1e3)
        self.prefill.labels(model).observe(max(0.0, u.ttft_ms - u.queue_ms) / 1e3)
        self.decode.labels(model).observe(max(0.0, u.total_ms - u.ttft_ms) / 1e3)
        gaps = u.generated_tokens - 1
        if gaps > 0 and u.decode_tps > 0:
            itl = self.itl.labels(model)
            for _ in range(gaps):
                itl.observe(1.0 / u.decode_tps)

    def rejected(self, reason: str = "refused") -> None:
        self.refused.labels(self.model, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
