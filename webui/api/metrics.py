"""Prometheus metrics for /metrics, through prometheus_client on a registry of our own.

Request outcomes, token counts and latency histograms are observed once per request, in
the engine thread as it ends, by the request's RequestEnd (webui/request_end.py), for the
API and the page alike; refusals are counted by whoever was refused. Queue depth, active
requests and the prefix cache's figures are read from the engine at scrape time, in the
thread serving /metrics. No MLX here: only engine.stats().
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from core.engine.requests import Failed, Finished

if TYPE_CHECKING:
    from core.engine.engine import Engine

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80, 160)


class _EngineCollector:
    def __init__(self, engine: Engine):
        self.engine = engine

    def collect(self):
        s = self.engine.stats()
        yield GaugeMetricFamily("radixchat_engine_alive", "1 while the engine thread runs", value=int(s["alive"]))
        yield GaugeMetricFamily("radixchat_queue_depth", "Requests waiting for a batch slot",
                                value=max(0, s["inflight"] - s["active"]))
        yield GaugeMetricFamily("radixchat_active_requests", "Requests in the engine", value=s["active"])
        cache = s.get("prefix_cache") or {}
        for key, help_ in (("nodes", "Radix tree nodes"), ("cached_tokens", "Tokens held by the cache"),
                           ("bytes", "Live K/V bytes held by the cache"), ("budget", "Cache byte budget"),
                           ("hits", "Lookups that reused a prefix"), ("misses", "Lookups that reused nothing"),
                           ("hit_tokens", "Prompt tokens served from the cache"),
                           ("evictions", "Nodes evicted to fit the budget"),
                           ("locks", "Cache paths locked by running requests"),
                           ("restore_ms", "Total time spent restoring cached prefixes, ms")):
            yield GaugeMetricFamily(f"radixchat_cache_{key}", help_, value=cache.get(key, 0))


class Metrics:
    def __init__(self, engine: Engine):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("radixchat_requests", "Requests by outcome", ["outcome"], registry=r)
        self.prompt_tokens = Counter("radixchat_prompt_tokens", "Prompt tokens", registry=r)
        self.cached_tokens = Counter("radixchat_cached_prompt_tokens", "Prompt tokens from the cache", registry=r)
        self.generated_tokens = Counter("radixchat_generated_tokens", "Generated tokens", registry=r)
        self.ttft = Histogram("radixchat_time_to_first_token_seconds", "Time to first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.latency = Histogram("radixchat_request_latency_seconds", "Submit to last token",
                                 buckets=_LATENCY_BUCKETS, registry=r)
        r.register(_EngineCollector(engine))

    def observe(self, final: Finished | Failed) -> None:
        """One request's end. Counters and histograms only: cheap enough for the engine thread."""
        u = final.usage
        if isinstance(final, Failed):
            outcome = "error"
        else:
            outcome = "cancelled" if final.finish_reason == "cancelled" else "ok"
        self.requests.labels(outcome).inc()
        self.prompt_tokens.inc(u.prompt_tokens)
        self.cached_tokens.inc(u.cached_tokens)
        self.generated_tokens.inc(u.generated_tokens)
        if u.ttft_ms is not None:
            self.ttft.observe(u.ttft_ms / 1e3)
        self.latency.observe(u.total_ms / 1e3)

    def rejected(self) -> None:
        self.requests.labels("rejected").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
