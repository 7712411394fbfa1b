"""--kv-bits (core.cache.kv_format, core.cache.rounded): the formats' round trip is idempotent
(what makes a cached prefix read back exactly what the batch attended over), their bytes, and
what is refused: a precision that is not one, a model whose heads the groups do not divide."""

from __future__ import annotations

import mlx.core as mx
import pytest
from pydantic import ValidationError

from radixchat.core.cache.kv_format import FORMATS, kv_format
from radixchat.core.config import Settings
from radixchat.core.engine.engine import Engine
from radixchat.core.models.models_file import specs


@pytest.mark.parametrize(("bits", "group"), [(8, None), (8, 64), (8, 128), (4, None)])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16])
def test_a_round_trip_of_a_round_trip_is_itself(bits, group, dtype):
    fmt = kv_format(bits, group)
    assert fmt.group == (group or FORMATS[bits].group)
    mx.random.seed(3)
    x = (mx.random.normal((2, 3, 40, 128)) * 4).astype(dtype)
    once = fmt.round_trip(x)
    assert once.dtype == dtype
    assert mx.array_equal(fmt.round_trip(once), once).item()
    assert not mx.array_equal(once, x).item()  # it does round: it is a precision, not a copy
    # the codes and scales decode to the same numbers whether encoded once or twice
    assert mx.array_equal(fmt.decode(*fmt.encode(once), dtype), once).item()


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
def test_eight_bits_round_trip_keeps_every_largest_magnitude_a_16_bit_dtype_holds(dtype):
    """Each positive finite number of the dtype as a group's largest magnitude, the group's
    other 31 numbers below it: the round trip of the round trip is itself (in float32 a code
    times its scale is exact; in 16 bits it rounds, and only trying each shows the scale comes
    back every time)."""
    fmt = FORMATS[8]
    if dtype == mx.float16:
        most = mx.view(mx.arange(1, 0x7C00, dtype=mx.uint16), mx.float16)
    else:  # a bfloat16 is a float32's upper 16 bits
        most = mx.view(mx.arange(1, 0x7F80, dtype=mx.uint32) << 16, mx.float32).astype(mx.bfloat16)
    mx.random.seed(5)
    rest = mx.random.uniform(-1, 1, (most.size, 31)) * most.astype(mx.float32)[:, None]
    x = mx.concatenate([most[:, None], rest.astype(dtype)], axis=1)
    once = fmt.round_trip(x)
    assert mx.isfinite(once).all().item()
    assert mx.array_equal(fmt.round_trip(once), once).item()


def test_eight_bits_rounds_finer_than_a_power_of_two_scale():
    """Why `Int8` replaced `Pow2Int8` at 8 bits: a scale with 8 significant bits rather
    than 1 lets a group's numbers use all 127 steps, not 64 to 127 of them."""
    from radixchat.core.cache.kv_format import POW2_INT8

    mx.random.seed(3)
    x = mx.random.normal((4, 8, 256, 64))
    error = [mx.abs(f.round_trip(x) - x).mean().item() for f in (FORMATS[8], POW2_INT8)]
    assert error[0] < 0.75 * error[1]


def test_mlxs_affine_format_is_not_idempotent_which_is_why_it_is_not_offered():
    """mlx-lm's QuantizedKVCache format: cached from what a batch held, it would read back
    other numbers than the batch attended over."""
    mx.random.seed(3)
    x = mx.random.normal((1, 2, 64, 64))
    parts = mx.quantize(x, group_size=64, bits=8)
    once = mx.dequantize(*parts, group_size=64, bits=8)
    twice = mx.dequantize(*mx.quantize(once, group_size=64, bits=8), group_size=64, bits=8)
    assert not mx.array_equal(once, twice).item()


@pytest.mark.parametrize(("bits", "group", "most"), [(8, None, 0.54), (8, 64, 0.52), (8, 128, 0.51), (4, None, 0.29)])
def test_bytes_a_number_against_sixteen_bits(bits, group, most):
    fmt = kv_format(bits, group)
    x = mx.zeros((1, 4, 10, 128), dtype=mx.bfloat16)
    stored = sum(a.nbytes for a in fmt.encode(x))
    assert stored == 4 * 10 * fmt.bytes_per(128)
    assert stored / x.nbytes <= most


def test_what_is_refused():
    assert kv_format(16) is None and kv_format(8).mode == "int8" and kv_format(4).mode == "nvfp4"
    with pytest.raises(ValueError, match="kv_bits"):
        kv_format(6)
    with pytest.raises(ValidationError, match="kv_bits"):
        Settings(kv_bits=6)


@pytest.mark.parametrize(
    ("bits", "group", "says"),
    [
        (16, 64, "at kv_bits 16 K/V keeps the model's dtype"),
        (4, 32, "at kv_bits 4 the format's groups are fixed"),
        (4, 16, "at kv_bits 4 the format's groups are fixed"),
        (8, 48, "at kv_bits 8, one of 32, 64, 128"),
        (8, 256, "at kv_bits 8, one of 32, 64, 128"),
    ],
)
def test_a_group_size_is_refused_where_it_is_not_one(bits, group, says):
    """--kv-group-size is 8 bits' alone: at 16 there are no groups, nvfp4's are its own."""
    with pytest.raises(ValidationError, match=f"kv_group_size {group}: .*{says}"):
        Settings(kv_bits=bits, kv_group_size=group)
    with pytest.raises(ValueError, match=says):
        kv_format(bits, group)
    assert Settings(kv_bits="8", kv_group_size="64").kv_group_size == 64  # as the command line writes them
    assert kv_format(8, 64).name == "int8-g64" and kv_format(8, 32).name == kv_format(8).name == "int8"


def test_a_models_file_sets_it_per_model(tmp_path):
    f = tmp_path / "models.toml"
    f.write_text('[[model]]\npath = "tiny"\nkv_bits = 8\n\n[[model]]\npath = "default"\n')
    first, second = specs(Settings(models=str(f)))
    assert first.overrides["kv_bits"] == 8 and "kv_bits" not in second.overrides
    f.write_text('[[model]]\npath = "tiny"\nkv_bits = 8\nkv_batch = "codes"\n')
    assert specs(Settings(models=str(f)))[0].overrides == {"kv_bits": 8, "kv_batch": "codes"}
    f.write_text('[[model]]\npath = "tiny"\nkv_bits = 5\n')
    with pytest.raises(ValueError, match="kv_bits"):
        specs(Settings(models=str(f)))
    f.write_text('[[model]]\npath = "tiny"\nkv_bits = 8\nkv_group_size = 64\n')
    assert specs(Settings(models=str(f)))[0].overrides == {"kv_bits": 8, "kv_group_size": 64}
    # a model's own precision against the server's group, and a group without 8 bits
    f.write_text('[[model]]\npath = "tiny"\nkv_bits = 4\n')
    with pytest.raises(ValueError, match=r"number 1: kv_group_size 64: .* kv_bits 4"):
        specs(Settings(models=str(f), kv_bits=8, kv_group_size=64))
    f.write_text('[[model]]\npath = "tiny"\n\n[[model]]\npath = "default"\nkv_group_size = 128\n')
    with pytest.raises(ValueError, match=r"number 2: kv_group_size 128: .* kv_bits 16"):
        specs(Settings(models=str(f)))


def test_a_model_whose_heads_the_groups_do_not_divide_is_refused_at_start(tiny_model_dir, tiny_wide_dir):
    """The tiny random model's heads hold 16 numbers: the formats' scales cover 32. The wide
    one's hold 32: a group of 64 does not divide them, and the refusal says what would."""
    with pytest.raises(ValueError, match="groups of 32"):
        Engine(Settings(model=str(tiny_model_dir), kv_bits=8)).start(timeout=120)
    with pytest.raises(ValueError, match=r"groups of 64; .* or a kv_group_size that divides its heads"):
        Engine(Settings(model=str(tiny_wide_dir), kv_bits=8, kv_group_size=64)).start(timeout=120)


@pytest.mark.parametrize("kv_batch", ["values", "codes"])
def test_a_larger_group_holds_a_token_in_fewer_bytes(kv_batch, tiny_wider_dir, store):
    """Heads of 64 numbers at --kv-group-size 64: a bfloat16 scale per 64 codes in the tree
    (and in a batch that holds codes, its scale and bias planes), where the engine, the
    doctor and the tree agree; a cached prefix gives the reply it gave computed afresh."""
    from mlx_lm import load

    from radixchat.core.cache.kv import kv_bytes_per_token
    from radixchat.core.platform.doctor import batch_bytes_per_token, kv_precision
    from radixchat.core.seam.requests import Sampling
    from radixchat.webui.page.logic.dashboard import Presence, summary_table

    prompts = [list(range(5, 60)) * 2, list(range(7, 90))]

    s = Settings(model=str(tiny_wider_dir), kv_bits=8, kv_group_size=64, kv_batch=kv_batch, dtype="float32")
    eng = Engine(s).start(timeout=120)
    try:
        texts = [eng.submit_tokens(p, Sampling(max_tokens=24, ignore_eos=True)).result().text for p in prompts]
        again = [eng.submit_tokens(p, Sampling(max_tokens=24, ignore_eos=True)).result().text for p in prompts]
        tab = summary_table(eng, store, Presence())
        tree, batch_bpt, info = eng.stats().prefix_cache, eng.kv_bytes_per_token, eng.info
    finally:
        eng.stop()
    assert again == texts  # from the prefix cache: transparent at this group too
    model, _ = load(str(tiny_wider_dir))
    bpt = kv_bytes_per_token(model)  # float32, every layer's K and V
    assert tree.cached_tokens > 0 and tree.bytes == tree.cached_tokens * bpt * (8 + 16 / 64) // 32
    # codes: 8 bits a number, and a float32 scale and bias per 64 (MLX's affine planes)
    assert batch_bpt == (bpt * (8 + 2 * 32 / 64) // 32 if kv_batch == "codes" else bpt)
    assert batch_bpt == (batch_bytes_per_token(kv_format(8, 64), bpt, "float32", kv_batch) or bpt)
    line = kv_precision(kv_format(8, 64), bpt, "float32", model, kv_batch)
    assert line.startswith("int8-g64 (--kv-bits 8, 64 numbers a scale)"), line
    assert info.kv_group == 64 and "K/V at 8 bits, a scale per 64 numbers" in tab  # the Server tab


@pytest.mark.parametrize("kv_batch", ["values", "codes"])
def test_the_engine_says_its_precision_and_the_server_tab_shows_it(kv_batch, tiny_wide_dir, store):
    from radixchat.core.seam.requests import Finished, Sampling
    from radixchat.webui.page.logic.dashboard import Presence, summary_table

    eng = Engine(Settings(model=str(tiny_wide_dir), kv_bits=4, kv_batch=kv_batch)).start(timeout=120)
    try:
        assert isinstance(eng.submit_tokens(list(range(5, 80)), Sampling(max_tokens=4)).result(), Finished)
        tree = eng.stats().prefix_cache
        [line] = [x for x in summary_table(eng, store, Presence()).splitlines() if x.startswith("| Model |")]
    finally:
        eng.stop()
    assert eng.info.kv_bits == 4 and "K/V at 4 bits" in line
    assert (
        eng.info.kv_batch_codes == ("the prefix cache and the decoding batch hold it" in line) == (kv_batch == "codes")
    )
    # the tree holds a token at 4 bits a number and 8 bits of scale per 16, against float32's 32;
    # a batch that holds codes, as many
    per_token = eng.kv_bytes_per_token * (4 + 8 / 16) // 32 if kv_batch == "values" else eng.kv_bytes_per_token
    assert tree.cached_tokens > 0 and tree.bytes == tree.cached_tokens * per_token


@pytest.mark.parametrize(("bits", "dtype"), [(8, "float32"), (8, "bfloat16"), (4, "float32")])
def test_every_batch_layout_attends_at_the_same_precision(bits, dtype, tiny_wide_dir):
    """At 8 or 4 bits, in float32 or bfloat16, the same greedy replies whichever cache holds
    the decoding rows: the slots (with and without speculative drafts), mlx-lm's BatchKVCache,
    mlx-lm's step order, the prefix cache off; and, at 4 bits, other replies than at 16 (the
    precision is real; 8 bits changes none of these few on this model)."""
    from radixchat.core.seam.requests import Sampling

    prompts = [list(range(5, 60)) * 2, list(range(7, 90)), [3, 4, 5, 6] * 20]

    def replies(**kw) -> list[str]:
        eng = Engine(Settings(model=str(tiny_wide_dir), max_tokens=64, dtype=dtype, **kw)).start(timeout=120)
        try:
            first = [eng.submit_tokens(p, Sampling(max_tokens=40, ignore_eos=True)) for p in prompts]
            texts = [h.result().text for h in first]
            again = [eng.submit_tokens(p, Sampling(max_tokens=40, ignore_eos=True)).result().text for p in prompts]
            assert again == texts  # the second time from the prefix cache, where it is on
            return texts
        finally:
            eng.stop()

    reference = replies(kv_bits=bits, prefix_cache=False)
    for layout in (dict(), dict(speculate=4), dict(kv_slots=False), dict(step_tokens=0)):
        assert replies(kv_bits=bits, **layout) == reference, layout
    if bits == 4:
        assert replies(kv_bits=16, prefix_cache=False) != reference


def test_the_doctor_says_when_the_server_would_refuse_a_models_heads(tiny_model_dir, tiny_wide_dir):
    """`radixchat doctor --kv-bits 8` on a model whose heads (16 numbers) the format's groups
    of 32 do not divide says the server refuses it, as the engine does at start
    (test_a_model_whose_heads_the_groups_do_not_divide_is_refused_at_start); where they
    divide, it says what the precision holds."""
    from mlx_lm import load

    from radixchat.core.cache.kv import kv_bytes_per_token
    from radixchat.core.platform.doctor import kv_precision

    narrow, _ = load(str(tiny_model_dir))
    line = kv_precision(kv_format(8), kv_bytes_per_token(narrow), "float32", narrow)
    assert line.startswith("refused") and "heads (16 numbers)" in line and "kv_bits 16" in line, line
    wide, _ = load(str(tiny_wide_dir))
    line = kv_precision(kv_format(8), kv_bytes_per_token(wide), "float32", wide)
    assert line.startswith("int8 (--kv-bits 8, 32 numbers a scale)") and "refused" not in line, line
    assert kv_precision(kv_format(4), kv_bytes_per_token(wide), "float32", wide).startswith("nvfp4")
    bpt = kv_bytes_per_token(wide)
    assert "decoding batch holds it as float32" in kv_precision(kv_format(8), bpt, "float32", wide, kv_batch="values")
    line = kv_precision(kv_format(8), bpt, "float32", wide, kv_batch="codes")
    assert f"decoding batch holds it as codes ({bpt * 40 // 128:,} bytes a token, 0.31x" in line, line
