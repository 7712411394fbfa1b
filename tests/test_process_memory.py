"""What the whole process takes in memory: MLX's buffer-cache limit set by the engine and its
figures read after each step, the bound `doctor` and the Server tab state (its parts add up),
and the Server tab's memory line."""

from __future__ import annotations

import re
import sys

import pytest

from radixchat.core.config import Settings, mlx_cache_limit
from radixchat.core.engine.engine import Engine
from radixchat.core.engine.models import as_engines
from radixchat.core.platform.doctor import process_memory
from radixchat.core.platform.memory import (
    ARRAYS_OVER_KV,
    REST_BYTES,
    arrays_beyond,
    batch_geometry,
    bound_text,
    process_bound,
    process_rss,
    step_activations,
)
from radixchat.core.seam.requests import ChatRequest, Finished
from radixchat.webui.page.logic.dashboard import Presence, summary_table

MiB = 1 << 20


def one_reply(engine: Engine) -> None:
    req = ChatRequest(messages=[{"role": "user", "content": "Tell me about sets"}], sampling={"max_tokens": 8})
    assert isinstance(engine.submit(req).result(), Finished)


def sizes(text: str) -> list[float]:
    """Every "N MiB" / "N GiB" in `text`, in MiB."""
    return [
        float(n.replace(",", "")) * (1024 if u == "GiB" else 1) for n, u in re.findall(r"([\d,.]+) (MiB|GiB)", text)
    ]


@pytest.mark.parametrize("limit", [0, 256 * MiB])
def test_the_engine_sets_mlxs_cache_limit_and_reads_its_memory_after_each_step(tiny_model_dir, limit):
    engine = Engine(Settings(model=str(tiny_model_dir), cache_bytes=64 * MiB, mlx_cache_bytes=limit)).start(120)
    try:
        one_reply(engine)
        mem = engine.stats().memory
    finally:
        engine.stop()
    assert mem.cache_limit == limit
    # MLX keeps no freed buffer at 0; with room it keeps the steps' (its own CPU default, 32 MiB, would too)
    assert (mem.cache == 0) if limit == 0 else (0 < mem.cache <= limit)
    assert mem.active >= engine.info.weights_bytes and mem.peak >= mem.active
    assert 0 < mem.step_peak < mem.peak  # a step's activations rose over what stayed alive
    assert mem.step_bound == step_activations(engine.info.vocab_size, 256, 256)


def test_the_cache_limit_is_a_share_of_the_kv_budget_unless_set():
    assert mlx_cache_limit(Settings(), 512 * MiB) == 64 * MiB
    assert mlx_cache_limit(Settings(), 64 * MiB) == 32 * MiB  # MLX's own on a CPU, at least
    assert mlx_cache_limit(Settings(), 64 << 30) == 256 * MiB
    assert mlx_cache_limit(Settings(mlx_cache_bytes="0"), 512 * MiB) == 0
    assert mlx_cache_limit(Settings(mlx_cache_bytes="128MiB"), 512 * MiB) == 128 * MiB


def test_doctors_process_memory_names_each_part_and_they_add_up():
    settings = Settings(cache_bytes="512MiB", mlx_cache_bytes="48MiB", step_tokens=128)
    weights = 540 * MiB
    # SmolLM2-135M's K/V in float32: 46,080 bytes a token; the batch could outgrow the measure
    line = process_memory(weights, 49152, 8192, 46080, settings)
    beyond = arrays_beyond(512 * MiB, step_activations(49152, 128, 256), batch_geometry(256, 8192, 46080))
    assert beyond == int(ARRAYS_OVER_KV * 512 * MiB) + 2 * 4 * 49152 * 256
    parts = process_bound(weights, 512 * MiB, beyond, 48 * MiB)
    assert [n for _, n in parts[:-1]] == [weights, 512 * MiB, beyond, 48 * MiB, REST_BYTES]
    assert parts[-1] == ("total", sum(n for _, n in parts[:-1]))
    for name in ("weights", "K/V budget", "beyond it", "MLX buffer cache limit", "the rest", "bench_memory"):
        assert name in line
    total, *each = sizes(line)
    assert total == pytest.approx(sum(each), abs=0.02 * 1024)  # each rounded as printed
    assert total == pytest.approx(parts[-1][1] / MiB, abs=0.01 * 1024)


def test_a_small_models_batch_caps_what_is_stated_beyond_the_budget():
    """A model whose whole batch at the whole context is smaller than the measured share of
    the budget cannot take that share: the statement is capped by the batch's geometry."""
    settings = Settings(cache_bytes="4GiB", max_batch=32)
    tiny = batch_geometry(32, 2048, 4096)  # 1.5 GiB: far below the measured share of 4 GiB
    assert arrays_beyond(4 << 30, 0, tiny) == tiny < arrays_beyond(4 << 30, 0)
    total = sizes(process_memory(20 * MiB, 4096, 2048, 4096, settings))[0]
    assert total < 8 * 1024  # MiB: not the 20+ GB of the measured share alone


def test_the_server_tab_states_what_the_process_takes_and_holds(engine, store):
    # (no request here: the session's engine keeps its prefix cache for the other modules)
    [line] = [x for x in summary_table(engine, store, Presence()).splitlines() if x.startswith("| Memory |")]
    s = engine.stats()
    if sys.platform.startswith("linux"):
        assert "resident now" in line and process_rss()[0] > s.memory.active
    bound = line.split("the process will take ")[1].split(";")[0]
    total, weights, kv, beyond, cache_limit, rest = sizes(bound)
    assert weights == pytest.approx(engine.info.weights_bytes / MiB, abs=1)
    assert rest == pytest.approx(REST_BYTES / MiB, rel=0.01)  # as printed: GiB, two decimals
    assert kv == pytest.approx(s.kv_budget / MiB, rel=0.01)
    assert cache_limit == pytest.approx(s.memory.cache_limit / MiB, rel=0.01, abs=1)
    batch = batch_geometry(s.max_batch, engine.info.context_length, s.kv_bytes_per_token)
    allowance = arrays_beyond(s.kv_budget, s.memory.step_bound, batch)
    assert s.memory.beyond == allowance  # the engine states it (the tab does not rebuild it)
    seen = s.memory.peak - engine.info.weights_bytes - s.kv_budget  # the most seen, if above
    assert beyond == pytest.approx(max(allowance, seen) / MiB, rel=0.01, abs=1)
    assert total == pytest.approx(weights + kv + beyond + cache_limit + rest, rel=0.01)
    assert "MLX holds" in line and "freed buffers" in line
    # the engines state the bound through the seam; the tab prints it, rebuilding nothing
    assert bound_text(as_engines(engine).memory_bound()) in line
