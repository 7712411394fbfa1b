"""A decoding batch that holds --kv-bits codes (core.cache.batch.coded, --kv-batch codes):
attention over its codes is attention over their round trip, through any sequence of joins,
leaves and decodes; a row read back is the round trip exactly (what the prefix tree codes
again, to the same codes); its buffers take the codes' bytes; and an engine whose batch
holds codes gives the same greedy replies with and without the prefix cache and drafts, the
values batch's in float32, and counts a token at the codes' size."""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchKVCache

from radixchat.core.cache.batch.coded import CodedSlotKVCache
from radixchat.core.cache.batch.slots import SlotKVCache, swap_order
from radixchat.core.cache.kv_format import FORMATS
from radixchat.core.cache.rounded import RoundedBatchKVCache, RoundedKVCache
from radixchat.core.config import Settings
from radixchat.core.engine.engine import Engine
from radixchat.core.engine.step.coded_attention import attend, holds_codes

H, D = 2, 32


def single(rng: random.Random, fmt, n: int) -> RoundedKVCache:
    c = RoundedKVCache(fmt)
    c.update_and_fetch(mx.array(_numbers(rng, (1, H, n, D))), mx.array(_numbers(rng, (1, H, n, D))))
    return c


def _numbers(rng: random.Random, shape) -> list:
    if len(shape) == 1:
        return [rng.gauss(0, 2) for _ in range(shape[0])]
    return [_numbers(rng, shape[1:]) for _ in range(shape[0])]


def rows(cache) -> list:
    """Each row's visible keys and values (padding cut off), as a plain cache reads them."""
    b = cache.offset.shape[0]
    if isinstance(cache, SlotKVCache):
        return [(cache.extract(i).keys.tolist(), cache.extract(i).values.tolist()) for i in range(b)]
    pad = cache.left_padding.tolist()
    k, v = cache.keys[..., : cache._idx, :], cache.values[..., : cache._idx, :]
    return [(k[i : i + 1, :, pad[i] :, :].tolist(), v[i : i + 1, :, pad[i] :, :].tolist()) for i in range(b)]


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("seed", range(3))
def test_codes_attend_as_their_round_trip_through_joins_leaves_and_decodes(bits, seed):
    fmt = FORMATS[bits]
    rng = random.Random(seed)
    first = [single(rng, fmt, rng.randint(1, 9)) for _ in range(3)]
    lib, coded = BatchKVCache.merge(first), CodedSlotKVCache.adopt(RoundedBatchKVCache.merge(first))
    assert coded.fmt is fmt and isinstance(coded.keys, tuple)
    for step in range(40):
        op = rng.random()
        b = lib.offset.shape[0]
        if op < 0.25:  # a prompt joins, sometimes longer than the whole window
            joining = [single(rng, fmt, rng.randint(1, 3 * (lib._idx + 2))) for _ in range(rng.randint(1, 2))]
            lib.extend(BatchKVCache.merge(joining))
            coded.extend(RoundedBatchKVCache.merge(joining))
        elif op < 0.45 and b > 1:
            order = swap_order(sorted(rng.sample(range(b), rng.randint(1, b - 1))))
            lib.filter(mx.array(order))
            coded.filter(order)
        else:  # everyone decodes one token: the library over the round trip, the codes over codes
            k = mx.array(_numbers(rng, (b, H, 1, D)))
            q = k * 2 - 1
            mask = lib.make_mask(1)
            keys, values = lib.update_and_fetch(fmt.round_trip(k), fmt.round_trip(k + 1))
            want = mx.fast.scaled_dot_product_attention(q, keys, values, scale=0.5, mask=mask)
            mask = coded.make_mask(1)
            keys, values = coded.update_and_fetch(k, k + 1)
            got = attend(q, keys, values, fmt, 0.5, mask)
            assert mx.allclose(want, got, atol=1e-4).item(), (step, mx.abs(want - got).max().item())
        assert lib._idx == coded._idx and lib.left_padding.tolist() == coded.left_padding.tolist()
        assert rows(lib) == rows(coded), step  # read back: the round trip, exactly
    row = coded.extract(0)
    assert mx.array_equal(fmt.encode(row.keys)[0], fmt.encode(fmt.round_trip(row.keys))[0]).item()


@pytest.mark.parametrize(
    ("bits", "dtype", "most"), [(8, mx.float32, 0.32), (8, mx.bfloat16, 0.57), (4, mx.bfloat16, 0.29)]
)
def test_codes_take_the_formats_bytes(bits, dtype, most):
    fmt = FORMATS[bits]
    rng = random.Random(5)
    caches = []
    for _ in range(4):
        c = RoundedKVCache(fmt)
        c.update_and_fetch(*(mx.array(_numbers(rng, (1, H, 200, D))).astype(dtype) for _ in range(2)))
        caches.append(c)
    values, coded = SlotKVCache.merge(caches), CodedSlotKVCache.merge(caches)
    assert values._k[0].shape[:3] == coded._k[0].shape[:3]  # the same rows and columns
    assert coded.nbytes <= most * values.nbytes, coded.nbytes / values.nbytes


def test_which_batches_hold_codes():
    f8 = FORMATS[8]
    on_cpu = mx.default_device() == mx.cpu
    assert holds_codes("codes", f8, mx.float32, slots=True, routed=True)
    assert holds_codes("codes", f8, mx.bfloat16, slots=True, routed=True)
    assert holds_codes("auto", f8, mx.float32, slots=True, routed=True) is not on_cpu  # a GPU's
    assert not holds_codes("values", f8, mx.float32, slots=True, routed=True)
    assert not holds_codes("codes", None, mx.float32, slots=True, routed=True)  # --kv-bits 16
    assert not holds_codes("codes", f8, mx.float16, slots=True, routed=True)  # its scales: not exact
    assert not holds_codes("codes", f8, mx.float32, slots=False, routed=True)  # mlx-lm's BatchKVCache
    assert not holds_codes("codes", f8, mx.float32, slots=True, routed=False)  # attention not routable


@pytest.mark.parametrize("bits", [8, 4])
def test_an_engine_whose_batch_holds_codes(bits, tiny_wide_dir):
    """The same greedy replies from the prefix cache as computed afresh, with drafts as
    without; in float32 the values batch's replies (its attention reads the same numbers);
    a token of the batch counted at the codes' size."""
    from radixchat.core.seam.requests import Sampling

    prompts = [list(range(5, 60)) * 2, list(range(7, 90)), [3, 4, 5, 6] * 20]

    def replies(**kw) -> tuple[list[str], bool, int]:
        eng = Engine(Settings(model=str(tiny_wide_dir), max_tokens=64, kv_bits=bits, **kw)).start(timeout=120)
        try:
            first = [eng.submit_tokens(p, Sampling(max_tokens=40, ignore_eos=True)) for p in prompts]
            texts = [h.result().text for h in first]
            again = [eng.submit_tokens(p, Sampling(max_tokens=40, ignore_eos=True)).result().text for p in prompts]
            assert again == texts  # the second time from the prefix cache
            return texts, eng.batch_codes, eng.kv_bytes_per_token
        finally:
            eng.stop()

    codes, held, bpt = replies(kv_batch="codes")
    assert held
    assert replies(kv_batch="codes", speculate=4)[0] == codes
    values, held, values_bpt = replies(kv_batch="values")
    assert not held and values == codes
    fmt = FORMATS[bits]  # heads of 32 numbers in float32: codes, and a float32 scale (and bias) a group
    planes = 32 * bits / 8 + 4 * (2 if bits == 8 else 0) + (1 if bits == 4 else 0) * 2
    assert bpt == values_bpt * planes // (32 * 4), (bpt, values_bpt, fmt.mode)


def test_a_batch_asked_for_codes_that_cannot_hold_them_says_why(tiny_wide_dir, caplog):
    with caplog.at_level("WARNING", logger="radixchat.engine"):
        eng = Engine(Settings(model=str(tiny_wide_dir), kv_bits=8, kv_batch="codes", dtype="float16")).start(
            timeout=120
        )
        eng.stop()
    assert not eng.batch_codes
    assert "--kv-batch codes: the model's K/V is float16, whose scales" in caplog.text


def test_a_device_that_cannot_read_the_codes_is_found_out_at_start(tiny_wide_dir, caplog, monkeypatch):
    """A backend whose quantized matmul lacks a format's mode (or batched weights) would fail
    in the first decode step; the engine tries it at start and keeps values, saying why."""
    from radixchat.core.engine.step import coded_attention

    assert (
        coded_attention.probe(FORMATS[8], mx.float32) is None and coded_attention.probe(FORMATS[4], mx.bfloat16) is None
    )

    def refused(*a, **kw):
        raise ValueError("[quantized_matmul] mode not supported here")

    monkeypatch.setattr(mx, "quantized_matmul", refused)
    with caplog.at_level("WARNING", logger="radixchat.engine"):
        eng = Engine(Settings(model=str(tiny_wide_dir), kv_bits=8, kv_batch="codes")).start(timeout=120)
        eng.stop()
    assert not eng.batch_codes
    assert "cannot read affine codes ([quantized_matmul] mode not supported here)" in caplog.text


def test_the_doctor_counts_a_batch_that_holds_codes_at_their_size(tiny_wide_dir):
    """Its batch limit is the budget over the codes' bytes a token, as the engine's admission
    counts them (a batch of values: over the dtype's)."""
    from radixchat.core.models.model import load_model
    from radixchat.core.platform.doctor import _batch_limit

    m = load_model(str(tiny_wide_dir), "float32")

    def lines(**kw) -> dict[str, str]:
        return dict(_batch_limit(m, Settings(model=str(tiny_wide_dir), kv_bits=8, cache_bytes="64MiB", **kw)))

    values, codes = lines(kv_batch="values"), lines(kv_batch="codes")
    eng = Engine(Settings(model=str(tiny_wide_dir), kv_bits=8, kv_batch="codes")).start(timeout=120)
    eng.stop()
    assert f"{eng.kv_bytes_per_token:,} bytes per token of the batch" in codes["kv budget"], codes
    assert "holds it as codes" in codes["kv precision"] and "holds it as float32" in values["kv precision"]
    room = [int(x["batch limit"].split(" tokens")[0].replace(",", "")) for x in (values, codes)]
    assert room[1] == room[0] * 128 // 40, room  # float32 K/V against int8 codes with a float32 scale and bias
