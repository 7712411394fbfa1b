"""The decoding batch's slot K/V (core.cache.batch.slots): the same attention as mlx-lm's
BatchKVCache through any sequence of joins, leaves and decodes, while a join or a leave
writes only the rows that move; and the same greedy tokens from the engine's generator with
slots on and off."""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.generate import StopSequences
from mlx_lm.models.cache import BatchKVCache, KVCache

from radixchat.core.cache.batch import offset_guard
from radixchat.core.cache.batch.layout import layout_tokens, spare_bound
from radixchat.core.cache.batch.slots import SlotKVCache, swap_order
from radixchat.core.engine.step.stepper import BudgetedBatchGenerator

H, D = 2, 4


def single(rng: random.Random, n: int) -> KVCache:
    c = KVCache()
    c.update_and_fetch(
        mx.array([[[[rng.random() for _ in range(D)] for _ in range(n)] for _ in range(H)]]),
        mx.array([[[[rng.random() for _ in range(D)] for _ in range(n)] for _ in range(H)]]),
    )
    return c


def decode(cache, q: mx.array, k: mx.array) -> mx.array:
    """One decode step's attention, as mlx-lm's models run it: mask, then write, then attend."""
    mask = cache.make_mask(q.shape[2])
    keys, values = cache.update_and_fetch(k, k + 1)
    return mx.fast.scaled_dot_product_attention(q, keys, values, scale=0.5, mask=mask)


def rows(cache) -> list[list]:
    """Each row's visible keys (padding cut off) and its offset."""
    k = cache.keys[..., : cache._idx, :] if type(cache) is BatchKVCache else cache.keys
    pad = cache.left_padding.tolist()
    return [(k[i, :, pad[i] :, :].tolist(), cache.offset.tolist()[i]) for i in range(len(pad))]


def test_swap_order_fills_holes_from_the_end_and_moves_nothing_else():
    assert swap_order([0, 1, 2, 4, 5]) == [0, 1, 2, 5, 4]
    assert swap_order([1, 2, 3]) == [3, 1, 2]
    assert swap_order([0, 1, 2]) == [0, 1, 2]
    assert swap_order([5]) == [5]
    assert swap_order([]) == []
    keep = [0, 2, 3, 6, 7, 9]
    order = swap_order(keep)
    assert sorted(order) == keep and sum(i != j for i, j in enumerate(order)) == 3  # holes 1, 4, 5


@pytest.mark.parametrize("seed", range(6))
def test_slots_attend_like_the_library_through_joins_leaves_and_decodes(seed):
    rng = random.Random(seed)
    first = [single(rng, rng.randint(1, 9)) for _ in range(3)]
    lib, slot = BatchKVCache.merge(first), SlotKVCache.merge(first)
    for step in range(60):
        op = rng.random()
        b = lib.offset.shape[0]
        if op < 0.25:  # a prompt joins, sometimes longer than the whole window
            joining = [single(rng, rng.randint(1, 3 * (lib._idx + 2))) for _ in range(rng.randint(1, 2))]
            lib.extend(BatchKVCache.merge(joining))
            slot.extend(BatchKVCache.merge(joining))
        elif op < 0.45 and b > 1:  # some leave; the slot cache is told the swapped order
            keep = sorted(rng.sample(range(b), rng.randint(1, b - 1)))
            order = swap_order(keep)
            lib.filter(mx.array(order))
            slot.filter(order)
        else:  # everyone decodes one token; what they attend to must be the same
            k = mx.array([[[[rng.random() for _ in range(D)]] for _ in range(H)] for _ in range(b)])
            q = k * 2 - 1
            assert mx.allclose(decode(lib, q, k), decode(slot, q, k), atol=1e-6).item(), step
        assert lib._idx == slot._idx and lib.left_padding.tolist() == slot.left_padding.tolist()
        assert rows(lib) == rows(slot), step


def test_a_join_and_a_leave_write_only_the_rows_that_move():
    rng = random.Random(0)
    slot = SlotKVCache.merge([single(rng, 300) for _ in range(8)])
    slot.extend(BatchKVCache.merge([single(rng, 10)]))  # room for more rows now
    cap = slot._k[0].shape[0]
    assert cap > 10
    buffer = slot._k[0]
    before = buffer + 0  # a copy to compare against
    mx.eval(before)
    slot.extend(BatchKVCache.merge([single(rng, 20)]))
    assert slot._k[0] is buffer, "a join that fits re-laid the buffer"
    changed = mx.any(slot._k[0] != before, axis=(1, 2, 3)).tolist()
    assert changed == [i == 9 for i in range(cap)]
    before = slot._k[0] + 0
    mx.eval(before)
    slot.filter(swap_order([0, 1, 3, 4, 5, 6, 7, 8, 9]))
    changed = mx.any(slot._k[0] != before, axis=(1, 2, 3)).tolist()
    assert changed == [i == 2 for i in range(cap)]


def test_a_re_lay_leaves_room_before_the_window_for_the_next_longer_row():
    """A row longer than the window grows it to the left. A re-lay used to leave exactly the
    columns that row needed, so the next row a little longer re-laid every row again (at 32
    chat users, a re-lay every few steps); each re-lay now keeps a growth's worth there."""
    rng = random.Random(2)
    slot = SlotKVCache.merge([single(rng, 100) for _ in range(8)])
    slot.extend(BatchKVCache.merge([single(rng, 160)]))  # longer than the window: a re-lay
    buffer = slot._k[0]
    for n in (170, 180):  # a little longer each time: room is already there
        slot.extend(BatchKVCache.merge([single(rng, n)]))
        assert slot._k[0] is buffer, f"a row of {n} re-laid the buffers"
    assert slot._idx == 180 and slot.left_padding.tolist() == [80] * 8 + [20, 10, 0]


def test_a_batch_filling_up_in_bursts_never_holds_rows_past_its_limit(monkeypatch):
    """Growing by half again of the rows held took a batch of 32 to 40 rows of buffer: memory
    written at every re-lay and never used, and a half-empty batch (20 rows of 40) re-laid
    again to give it back. The room stops at the batch's limit; the re-lays as it fills are as
    few as before, and attention is the library's all the way."""
    relays = []
    real = SlotKVCache._relay
    monkeypatch.setattr(SlotKVCache, "_relay", lambda self, *a, **k: relays.append(a) or real(self, *a, **k))
    rng = random.Random(3)
    first = [single(rng, 50)]
    lib, slot = BatchKVCache.merge(first), SlotKVCache.adopt(BatchKVCache.merge(first), most_rows=32)
    for burst in (2, 1, 2, 2, 5, 2, 4, 2, 2, 9):  # 32 rows in all, as a closed loop fills
        joiners = [single(rng, rng.randint(20, 50)) for _ in range(burst)]
        lib.extend(BatchKVCache.merge(joiners))
        slot.extend(BatchKVCache.merge(joiners))
        assert slot._k[0].shape[0] <= 32 and slot._k[0].shape[0] <= 2 * slot._rows
    assert slot._rows == 32 and rows(lib) == rows(slot)
    assert len(relays) <= 9, relays  # adopt, then 8 of the 10 bursts
    k = mx.array([[[[rng.random() for _ in range(D)]] for _ in range(H)] for _ in range(32)])
    assert mx.allclose(decode(lib, k * 2 - 1, k), decode(slot, k * 2 - 1, k), atol=1e-6).item()


def test_rows_that_leave_give_their_memory_back_and_attention_is_unchanged():
    rng = random.Random(1)
    first = [single(rng, 600) for _ in range(8)] + [single(rng, 2000)]
    lib, slot = BatchKVCache.merge(first), SlotKVCache.merge(first)
    peak = slot._k[0].shape[0] * slot._k[0].shape[2]
    for keep in ([0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2], [0]):  # the long row leaves, then most others
        order = swap_order(keep)
        lib.filter(mx.array(order))
        slot.filter(order)
        held = slot._k[0].shape[0] * slot._k[0].shape[2]  # token slots of the buffers, spare room and all
        assert held <= spare_bound(layout_tokens(len(keep), slot._idx), len(keep)), (keep, held)
        assert rows(lib) == rows(slot)
        k = mx.array([[[[rng.random() for _ in range(D)]] for _ in range(H)] for _ in range(len(keep))])
        assert mx.allclose(decode(lib, k * 2 - 1, k), decode(slot, k * 2 - 1, k), atol=1e-6).item()
    assert held * 8 < peak  # one row of 600 holds a fraction of what nine rows of 2000 did


def test_a_captured_offset_keeps_its_value():
    """shared/seeds/004: every method that moves the offset rebinds it."""
    probes = offset_guard._probes(SlotKVCache)
    for name in ("update_and_fetch", "trim", "filter", "extend", "merge"):
        cache, action = probes[name]()
        captured = cache.offset
        before = captured.tolist()
        action(cache)
        assert captured.tolist() == before, name


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return load(str(tiny_model_dir))[0]


def run(model, slots: bool, plan) -> dict[int, list[int]]:
    """Greedy tokens per request for a plan of (step, prompt, max_tokens) arrivals."""
    gen = BudgetedBatchGenerator(
        model,
        step_tokens=64,
        on_prompt=lambda r: None,
        slots=slots,
        max_tokens=100,
        completion_batch_size=6,
        prefill_batch_size=2,
        prefill_step_size=64,
    )
    out, names, pending = {}, {}, list(plan)
    for step in range(400):
        while pending and pending[0][0] <= step:
            _, prompt, n = pending.pop(0)
            uid = gen.insert([prompt], max_tokens=[n], stop_sequences=[StopSequences()])[0]
            names[uid] = len(names)
        for r in gen.next()[1]:
            out.setdefault(names[r.uid], []).append(r.token)
        if (
            not pending
            and len(out) == len(plan)
            and not gen._generation_batch.uids
            and not gen._unprocessed_sequences
            and not gen._currently_processing
        ):
            break
    gen.close()
    return out


def test_the_generator_gives_the_same_tokens_with_slots_on_and_off(model):
    rng = random.Random(3)
    plan = sorted(
        (rng.randrange(0, 60), [rng.randrange(5, 250) for _ in range(rng.randint(3, 150))], rng.randint(1, 25))
        for _ in range(16)
    )
    on, off = run(model, True, plan), run(model, False, plan)
    assert len(on) == len(plan) and on == off
    assert all(len(on[i]) == plan[i][2] for i in range(len(plan)))


def test_storing_a_rows_new_tail_copies_the_tail_not_the_row():
    """A finished row's K/V goes to the prefix cache, which keeps a copy of what it lacks,
    mostly the reply's tail. `extract` gave a copy of the whole row first (~4x the time)."""
    from radixchat.core.cache.kv import KVSegment

    rng = random.Random(3)
    slot = SlotKVCache.merge([single(rng, 40) for _ in range(2)])
    big = BatchKVCache([0])
    big.update_and_fetch(mx.random.normal((1, H, 4000, D)), mx.random.normal((1, H, 4000, D)))
    slot.extend(big)
    mx.eval(slot._k, slot._v)
    row = slot.extract(2)
    assert row.offset == 4000
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    tail = KVSegment.from_caches([row], [True], 3936, 4000)
    mx.eval([kv for kv in tail.layers])
    whole = row.keys.nbytes + row.values.nbytes
    assert mx.get_peak_memory() - before < whole / 4, "the whole row was copied to store its tail"
    assert mx.array_equal(tail.layers[0][0], slot.keys[2:3, :, -64:, :]).item()


def test_a_leave_and_a_join_wait_for_one_evaluation_not_one_a_layer(monkeypatch):
    """Each evaluation waits for the step in flight (on a GPU, a sync and a launch): a row
    that left or joined cost one a layer, 30 on SmolLM2. Inside `one_eval` (the decoding
    batch's filter and extend) every layer's rows are written after a single one, with the
    same K/V as layer by layer."""
    from radixchat.core.cache.batch.slots import one_eval

    layers = 6

    def batch(seed: int) -> list[SlotKVCache]:
        rng = random.Random(seed)
        return [SlotKVCache.merge([single(rng, n) for n in (30, 40, 50, 60)]) for _ in range(layers)]

    def joiner(seed: int) -> list[BatchKVCache]:
        rng = random.Random(seed)
        return [BatchKVCache.merge([single(rng, 35)]) for _ in range(layers)]

    alone, together = batch(1), batch(1)
    evals = []
    real = mx.eval
    monkeypatch.setattr(mx, "eval", lambda *a: (evals.append(a), real(*a)))
    for c in alone:
        c.filter(swap_order([0, 1, 3]))
    assert len(evals) == layers  # before: a layer at a time
    evals.clear()
    with one_eval(together):
        for c in together:
            c.filter(swap_order([0, 1, 3]))
    assert len(evals) == 1
    for c, j in zip(alone, joiner(2)):
        c.extend(j)
    evals.clear()
    with one_eval(together):
        for c, j in zip(together, joiner(2)):
            c.extend(j)
    assert len(evals) == 1, "a join that fits its buffers re-laid them, or waited a layer at a time"
    for a, b in zip(alone, together):
        assert a._k is not None and rows(a) == rows(b)
        k = mx.array([[[[0.5] * D] for _ in range(H)] for _ in range(4)])
        assert mx.array_equal(decode(a, k, k), decode(b, k, k)).item()


def test_a_batch_outgrowing_its_buffers_re_lays_one_layer_a_step(monkeypatch):
    """A re-lay copies a layer's every row: at 32 rows of ~1,500 tokens all of a model's layers
    re-laid in one step (0.2 s a layer on the bundled model here), a stall that every stream
    and every newcomer's first token waited for. Staggered by their place in the model, the
    layers re-lay in steps of their own, and attend as the library's all the way."""
    relays: list[int] = []
    real = SlotKVCache._relay
    monkeypatch.setattr(SlotKVCache, "_relay", lambda self, *a, **k: relays.append(id(self)) or real(self, *a, **k))
    rng = random.Random(4)
    layers = 6
    first = [[single(rng, 300) for _ in range(4)] for _ in range(layers)]
    libs = [BatchKVCache.merge(rows_) for rows_ in first]
    slots = [SlotKVCache.adopt(BatchKVCache.merge(rows_), stagger=i) for i, rows_ in enumerate(first)]
    relays.clear()
    per_step = []
    for _ in range(400):  # past several growths of the window
        k = mx.array([[[[rng.random() for _ in range(D)]] for _ in range(H)] for _ in range(4)])
        before = len(relays)
        for lib, slot in zip(libs, slots):
            want, got = decode(lib, k * 2 - 1, k), decode(slot, k * 2 - 1, k)
            assert mx.allclose(want, got, atol=1e-6).item()
        per_step.append(len(relays) - before)
    assert sum(per_step) >= 2 * layers  # the window outgrew the buffers more than once
    assert max(per_step) == 1, per_step  # never two layers in one step
