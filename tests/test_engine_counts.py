"""Running and waiting requests are counted once, by the engine, and shown alike by /health,
/metrics and the page's Server tab (core.seam.protocol.EngineStats)."""

from __future__ import annotations

import re
import time

import pytest
from fastapi.testclient import TestClient

from radixchat.core.config import Settings
from radixchat.core.engine.engine import Engine
from radixchat.core.seam.requests import ChatRequest
from radixchat.webui.api.metrics import Metrics
from radixchat.webui.page.logic.dashboard import Presence, dashboard
from radixchat.webui.server import build_app
from tests.support.metrics import metric_value


class Frozen:
    """The engine behind the seam, its stats() held at one snapshot so three readers agree or not."""

    def __init__(self, engine: Engine, snapshot):
        self.info, self.snapshot = engine.info, snapshot

    def stats(self):
        return self.snapshot


@pytest.fixture(scope="module")
def two_rows(tiny_model_dir):
    eng = Engine(
        Settings(model=str(tiny_model_dir), max_batch=2, max_prefill_batch=2, max_tokens=480, max_queue=16)
    ).start(timeout=120)
    yield eng
    eng.stop()


def long_request(i: int) -> ChatRequest:
    return ChatRequest(
        messages=[{"role": "user", "content": f"count to a thousand, {i}"}],
        sampling={"max_tokens": 480, "ignore_eos": True, "temperature": 0.0},
    )


def test_a_full_batch_and_a_queue_are_counted_once_and_shown_alike(two_rows, store):
    handles = [two_rows.submit(long_request(i)) for i in range(6)]
    try:
        deadline, snap = time.time() + 30, None
        while time.time() < deadline:
            s = two_rows.stats()
            if s.running == 2:
                snap = s
                break
            time.sleep(0.001)
        assert snap is not None, two_rows.stats()
        # two in the batch, four waiting in the fair queue (none has ended: 480 tokens each)
        assert (snap.running, snap.waiting) == (2, 4), snap

        frozen = Frozen(two_rows, snap)
        health = TestClient(build_app(frozen, two_rows.settings, None)).get("/health").json()
        scraped = Metrics(frozen).render().decode()
        tab = dashboard(frozen, store, Presence()).summary
        assert (health["active_requests"], health["queue_depth"]) == (2, 4)
        assert metric_value(scraped, "radixchat:num_requests_running") == 2
        assert metric_value(scraped, "radixchat:num_requests_waiting") == 4
        engine_line = next(line for line in tab.splitlines() if line.startswith("| Engine |"))
        assert re.search(r"\b2 running requests, 4 waiting\b", engine_line), engine_line
    finally:
        for h in handles:
            h.cancel()
        for h in handles:
            h.result()
    assert two_rows.stats().inflight == 0
