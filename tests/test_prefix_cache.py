"""The prefix cache with real K/V: physical trim, byte accounting, and transparency."""

from __future__ import annotations

import gc
import random
import threading

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

from radixchat.core.cache.kv import PrefixStore
from radixchat.core.engine.sched.admission import MIN_SHARED_PREFIX
from radixchat.core.seam.requests import ChatRequest
from tests.support.conversations import SYSTEMS, conversations, engine_for, run_users
from tests.support.randmodel import SLIDING_WINDOW


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    model, tok = load(str(tiny_model_dir))
    return model, tok


def prefill(model, tokens, cache=None):
    cache = cache if cache is not None else make_prompt_cache(model)
    logits = model(mx.array([tokens]), cache=cache)
    mx.eval(logits, [c.state for c in cache])
    return logits, cache


def test_seed_crash_trim_is_physical(tiny):
    """shared/seeds/000: restore 292 tokens, shorten to 97, append a short suffix."""
    model, _ = tiny
    rng = random.Random(0)
    seq = [rng.randrange(5, 390) for _ in range(292)]
    suffix = [rng.randrange(5, 390) for _ in range(6)]
    _, full = prefill(model, seq)

    # mlx-lm's own trim only moves the offset: the stale tail stays (the hazard)
    plain = make_prompt_cache(model)
    for c, f in zip(plain, full):
        c.keys, c.values, c.offset = f.keys[..., :292, :], f.values[..., :292, :], 292
    for c in plain:
        c.trim(292 - 97)
    assert all(c.offset == 97 and c.keys.shape[2] == 292 for c in plain)

    # the project's path: match 97 tokens, restore exactly 97, then prefill the suffix
    store = PrefixStore(model, budget_bytes=1 << 30)
    assert store.store(seq, full)
    m, restored = store.lookup(seq[:97] + suffix)
    assert m.length == 97
    assert all(c.keys.shape[2] == c.offset == 97 for c in restored)
    logits, after = prefill(model, suffix, restored)
    assert all(c.offset == 97 + len(suffix) for c in after)
    assert all(c.keys[..., : c.offset, :].shape[2] == 97 + len(suffix) for c in after)
    fresh, _ = prefill(model, seq[:97] + suffix)
    assert mx.allclose(logits[0, -1], fresh[0, -1], atol=1e-4, rtol=1e-4).item()
    store.release(m)


def test_tree_holds_live_tokens_only_and_pins_no_buffer(tiny):
    model, _ = tiny
    gc.collect()
    base = mx.get_active_memory()
    store = PrefixStore(model, budget_bytes=1 << 30)
    rng = random.Random(1)
    for n in (292, 37, 150):
        seq = [rng.randrange(5, 390) for _ in range(n)]
        logits, cache = prefill(model, seq)  # KVCache buffers grow in steps of 256: capacity > n
        assert cache[0].keys.shape[2] > n
        store.store(seq, cache)
        del cache, logits
    gc.collect()
    tree = store.tree
    tree.check()
    assert tree.bytes == tree.tokens * store.bytes_per_token
    held = mx.get_active_memory() - base
    # what MLX still holds is the tree's live bytes, not the prefill buffers' capacity
    assert held <= tree.bytes * 1.05 + 65536, (held, tree.bytes)


_UNCACHED: dict = {}  # (model, bits): the reference's answers, which the values and codes cases share


def _uncached_answers(model_dir, kv_bits: int, plan) -> dict:
    key = (str(model_dir), kv_bits, repr(plan))
    if key not in _UNCACHED:
        off = engine_for(model_dir, prefix=False, step_tokens=0, kv_bits=kv_bits)
        try:
            answers, no_hits = run_users(off, plan, seed=1)
        finally:
            off.stop()
        assert not any(no_hits.values())
        _UNCACHED[key] = answers
    return _UNCACHED[key]


@pytest.mark.parametrize(
    ("kind", "kv_bits", "kv_batch"),
    [
        ("plain", 16, "values"),
        ("hybrid", 16, "values"),
        ("sliding", 16, "values"),
        ("plain", 8, "values"),
        ("plain", 8, "codes"),
        ("plain", 4, "values"),
        ("plain", 4, "codes"),
        ("sliding", 8, "values"),
        ("sliding", 8, "codes"),
    ],
)
def test_cache_is_transparent(kind, kv_bits, kv_batch, request):
    """Greedy answers are the same with the cache on and off. "sliding" prompts are all
    longer than the window, so the rotating caches restored from snapshots have wrapped.
    The reference runs mlx-lm's own step order; the cached engine prefills in small chunks
    under a step budget (core.engine.step.stepper), so chunk ends fall inside messages.
    At 8 or 4 bits both attend over K/V at that precision, and the tree holds its codes; with
    `codes` the cached engine's decoding batch holds them too (in float32 its attention reads
    the numbers the reference's does)."""
    fixture = {"plain": "tiny_model_dir", "hybrid": "tiny_hybrid_dir", "sliding": "tiny_sliding_dir"}
    if kv_bits != 16:  # the formats' groups need heads of 32 numbers at least
        fixture = {"plain": "tiny_wide_dir", "sliding": "tiny_wide_sliding_dir"}
    model_dir = request.getfixturevalue(fixture[kind])
    plan = conversations(seed=7, users=6, turns=3)
    expected = _uncached_answers(model_dir, kv_bits, plan)
    on = engine_for(model_dir, prefix=True, step_tokens=40, kv_bits=kv_bits, kv_batch=kv_batch)
    try:
        got, hits = run_users(on, plan, seed=2)
        got_again, hits_again = run_users(on, plan, seed=3)  # a warm cache, other order
        summary = on.prefix.tree.summary()
        codes = on.batch_codes
    finally:
        on.stop()
    assert codes == (kv_batch == "codes")
    assert got == expected and got_again == expected
    later_turns = [hits[k] for k in hits if k[1] > 0]
    assert sum(1 for h in later_turns if h > 0) == len(later_turns), "every later turn should hit"
    assert all(h > 0 for h in hits_again.values())
    assert summary["hits"] > 0 and summary["hit_tokens"] > 0
    if kind != "plain":
        assert on.prefix.hybrid
    if kind == "sliding":
        assert min(later_turns) > SLIDING_WINDOW, "a restored rotating cache should have wrapped"


def test_fifty_conversations_share_one_system_prompt(tiny_model_dir):
    eng = engine_for(tiny_model_dir, prefix=True, context_length=512)
    try:
        tok = eng.loaded.tokenizer
        system, sys_tokens = "", 0
        while sys_tokens < 300:  # a 300-token system prompt in this tiny tokenizer
            system += f"Rule {sys_tokens}: Python lists are mutable sequences. "
            sys_tokens = len(tok.apply_chat_template([{"role": "system", "content": system}]))
        assert 300 <= sys_tokens <= 340
        first = eng.submit(
            ChatRequest(messages=[{"role": "system", "content": system}, {"role": "user", "content": "question 0"}])
        ).result()
        bytes_one = eng.prefix.tree.bytes
        handles = [
            eng.submit(
                ChatRequest(
                    messages=[{"role": "system", "content": system}, {"role": "user", "content": f"question {i}"}]
                )
            )
            for i in range(1, 50)
        ]
        finals = [h.result() for h in handles]
        tree = eng.prefix.tree
        per_token = eng.prefix.bytes_per_token
        growth = tree.bytes - bytes_one
    finally:
        eng.stop()
    assert first.usage.cached_tokens == 0
    assert all(f.usage.cached_tokens >= sys_tokens for f in finals[8:])  # after the first batch
    # each conversation adds only its own tail: question, answer, a few template tokens
    per_conv = max(f.usage.prompt_tokens - sys_tokens + f.usage.generated_tokens for f in finals)
    assert growth <= 49 * per_conv * per_token
    assert growth < 49 * sys_tokens * per_token / 5


def test_long_random_workload_stays_in_budget_and_leaks_no_lock(tiny_model_dir):
    budget = 96 * 1024
    eng = engine_for(tiny_model_dir, prefix=True, cache_bytes=budget)
    rng = random.Random(11)
    words = ["lists", "dicts", "sets", "tuples", "yield", "class", "import", "async"]

    def worker(seed):
        r = random.Random(seed)
        for _ in range(10):
            msgs = [
                {"role": "system", "content": SYSTEMS[r.randrange(4)]},
                {"role": "user", "content": " ".join(r.choice(words) for _ in range(r.randrange(1, 30)))},
            ]
            h = eng.submit(ChatRequest(messages=msgs, sampling={"max_tokens": r.randrange(1, 20)}))
            if r.random() < 0.2:
                h.cancel()
            assert h.result() is not None

    try:
        threads = [threading.Thread(target=worker, args=(rng.random(),)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        tree = eng.prefix.tree
        assert eng.stats().inflight == 0
        tree.check()
        assert tree.bytes <= budget
        assert tree.stats.evictions > 0, "the workload should have exceeded the budget"
        assert tree.locks == 0 and tree.reserved == 0
        stack = list(tree.root.children.values())
        while stack:
            n = stack.pop()
            assert n.lock_ref == 0, "a lock leaked"
            stack.extend(n.children.values())
    finally:
        eng.stop()


def test_simultaneous_arrivals_share_one_prefill(tiny_model_dir):
    """Six users send the same new system prompt at once: it is prefilled once, not six times."""
    system = "You answer questions about Python lists, dicts, sets and tuples. " * 8
    questions = [f"Tell me about {w}" for w in ("lists", "dicts", "sets", "tuples", "yield", "async")]
    reqs = [
        ChatRequest(
            messages=[{"role": "system", "content": system}, {"role": "user", "content": q}], sampling={"max_tokens": 6}
        )
        for q in questions
    ]
    off = engine_for(tiny_model_dir, prefix=False)
    try:
        expected = [h.result().text for h in [off.submit(r) for r in reqs]]
    finally:
        off.stop()
    on = engine_for(tiny_model_dir, prefix=True)
    try:
        finals = [h.result() for h in [on.submit(r) for r in reqs]]
    finally:
        on.stop()
    assert [f.text for f in finals] == expected
    sys_len = finals[0].usage.prompt_tokens - 12  # roughly: all but the question and template
    assert sum(f.usage.cached_tokens >= sys_len for f in finals) == len(reqs) - 1


def test_one_prompt_sent_several_times_at_once_is_prefilled_once(tiny_model_dir):
    """An n>1 request's choices are requests of the same prompt (webui/api submits each), and
    a short one too: prefilled side by side, a flood's n=16 made the step that admitted it
    4x the others (docs/BENCHMARKS-LOG.md, "The rare misses, in a series"). One is prefilled;
    the others read it from the cache, each prefilling only its last token."""
    req = ChatRequest(
        messages=[{"role": "user", "content": "Name one use of a Python set."}], sampling={"max_tokens": 4}
    )
    off = engine_for(tiny_model_dir, prefix=False)
    try:
        expected = off.submit(req).result().text
    finally:
        off.stop()
    on = engine_for(tiny_model_dir, prefix=True)
    busy = ChatRequest(messages=[{"role": "user", "content": "Tell me about tuples."}], sampling={"max_tokens": 40})
    try:
        first = on.submit(busy)  # the four arrive while its steps run: drained in one turn
        finals = [h.result() for h in [on.submit(req) for _ in range(4)]]
        first.result()
    finally:
        on.stop()
    assert [f.text for f in finals] == [expected] * 4
    prompt = finals[0].usage.prompt_tokens
    assert prompt < MIN_SHARED_PREFIX  # the wait for a long shared prefix does not cover it
    assert sorted(f.usage.cached_tokens for f in finals)[1:] == [prompt - 1] * 3
