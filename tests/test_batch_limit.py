"""The working batch limit follows from memory: the K/V budget and the model's bytes per token,
with --max-batch only an upper bound."""

from __future__ import annotations

import threading
import time

import pytest

from radixchat.core.cache.batch.layout import BATCH_SHARE
from radixchat.core.config import Settings, kv_budget
from radixchat.core.engine.engine import Engine
from radixchat.core.seam.requests import Finished, Sampling

PROMPT = list(range(5, 25))  # 20 tokens
REPLY = 40


def test_bytes_per_token_is_measured_from_the_model(engine):
    s = engine.stats()
    # the tiny random llama: layers x 2 (K and V) x kv heads x head dim x 4 bytes (float32)
    args = engine.loaded.model.args
    heads = getattr(args, "num_key_value_heads", None) or args.num_attention_heads
    head_dim = getattr(args, "head_dim", None) or args.hidden_size // args.num_attention_heads
    assert s.kv_bytes_per_token == args.num_hidden_layers * 2 * heads * head_dim * 4
    assert s.batch_tokens == int(kv_budget(engine.settings) * BATCH_SHARE) // s.kv_bytes_per_token


def test_the_default_budget_is_a_share_of_memory():
    assert kv_budget(Settings(cache_bytes=123456789)) == 123456789
    assert kv_budget(Settings()) >= 256 << 20


@pytest.mark.parametrize("gib", [8, 16, 23, 64, 192])
def test_at_the_default_budget_the_process_bound_fits_three_quarters_of_the_machine(monkeypatch, gib):
    """What doctor and the Server tab state the process may take (weights aside) stays within
    three quarters of the machine: on a 23 GiB machine it said 23.2 GiB with a fifth as budget."""
    from radixchat.core import config
    from radixchat.core.platform.memory import ARRAYS_OVER_KV, REST_BYTES, process_bound

    monkeypatch.setattr(config, "machine_memory", lambda: gib << 30)
    settings = Settings()
    budget = kv_budget(settings)
    beyond = int(ARRAYS_OVER_KV * budget)  # the measured share; a small model's batch caps it lower
    *_, (_, total) = process_bound(0, budget, beyond, config.mlx_cache_limit(settings, budget))
    assert total <= (gib << 30) * 3 // 4, (total / 2**30, gib)
    assert budget <= (gib << 30) // 5 and total - REST_BYTES > (gib << 30) // 2  # and not much less


@pytest.fixture(scope="module")
def two_fit(tiny_model_dir, engine):
    need = (len(PROMPT) + REPLY) * engine.kv_bytes_per_token
    budget = int(2.5 * need / BATCH_SHARE)  # room for two such requests, not three
    eng = Engine(
        Settings(model=str(tiny_model_dir), cache_bytes=budget, max_batch=64, max_prefill_batch=4, max_tokens=REPLY)
    ).start(timeout=120)
    yield eng
    eng.stop()


def test_the_batch_holds_what_the_budget_has_room_for_not_a_fixed_count(two_fit):
    peak, done = [0], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], len(two_fit._by_uid))
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    handles = [two_fit.submit_tokens(PROMPT, Sampling(max_tokens=REPLY, ignore_eos=True)) for _ in range(6)]
    finals = [h.result() for h in handles]
    done.set()
    watcher.join()
    assert all(isinstance(f, Finished) and f.usage.generated_tokens == REPLY for f in finals)
    # admitted by what they hold (a prompt and a few steps' growth), not by whole replies:
    # more than two start, fewer than six (max_batch 64 would have let all six in)
    assert 2 < peak[0] < 6, peak[0]


def test_a_request_larger_than_the_room_still_runs_alone(two_fit):
    big = two_fit.submit_tokens(PROMPT, Sampling(max_tokens=REPLY * 4, ignore_eos=True))
    small = two_fit.submit_tokens(PROMPT, Sampling(max_tokens=4, ignore_eos=True))
    assert isinstance(big.result(), Finished) and big.result().usage.generated_tokens == REPLY * 4
    assert isinstance(small.result(), Finished)
