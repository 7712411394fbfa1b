"""Write tiny llama GGUF files for tests: the random model of `randmodel.py`, as llama.cpp
would have converted it.

Fixed seed, no downloads. The weights are renamed to llama.cpp's tensor names with Q and K
rows permuted into its rotary layout; the tokenizer (vocabulary, merges, special tokens,
chat template) goes into GGUF metadata. Two writers: MLX's `mx.save_gguf`, for float32
tensors (it writes no packed types), and `save_raw` here, for llama.cpp's Q4_0/Q8_0 blocks
and for tensor types a reader must refuse. The raw writer shares no code with the reader in
core/models/gguf.py, so each checks the other.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

# llama.cpp's type ids, and the bytes of one block of 32 (or 256) weights
TYPE_IDS = {"F32": 0, "Q4_0": 2, "Q8_0": 8, "Q4_K": 12, "BF16": 30}
_BLOCK_BYTES = {"Q4_K": (256, 144)}

_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def _gguf_name(name: str) -> str:
    module, _, leaf = name.rpartition(".")
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    if module in top:
        return f"{top[module]}.{leaf}"
    _, _, layer, rest = module.split(".", 3)  # model.layers.N.rest
    return f"blk.{layer}.{_NAMES[rest]}.{leaf}"


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert: each head's two rotary halves interleaved row by row."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tensors_from_folder(folder: Path) -> dict[str, np.ndarray]:
    import mlx.core as mx

    config = json.loads((folder / "config.json").read_text())
    out = {}
    for name, w in mx.load(str(folder / "model.safetensors")).items():
        w = np.array(w.astype(mx.float32))
        if name.endswith("q_proj.weight"):
            w = _permute(w, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            w = _permute(w, config["num_key_value_heads"])
        out[_gguf_name(name)] = w
    return out


def metadata_from_folder(folder: Path, name: str, arch: str = "llama") -> dict:
    """GGUF metadata as plain Python values (ints are written as uint32, floats as float32)."""
    config = json.loads((folder / "config.json").read_text())
    tok = json.loads((folder / "tokenizer.json").read_text())
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    special = {t["content"] for t in tok["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    return {
        "general.architecture": arch,
        "general.name": name,
        f"{arch}.block_count": config["num_hidden_layers"],
        f"{arch}.context_length": config["max_position_embeddings"],
        f"{arch}.embedding_length": config["hidden_size"],
        f"{arch}.feed_forward_length": config["intermediate_size"],
        f"{arch}.attention.head_count": config["num_attention_heads"],
        f"{arch}.attention.head_count_kv": config["num_key_value_heads"],
        f"{arch}.rope.freq_base": float(config["rope_theta"]),
        f"{arch}.attention.layer_norm_rms_epsilon": float(config["rms_norm_eps"]),
        f"{arch}.vocab_size": config["vocab_size"],
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": [3 if t in special else 1 for t in tokens],
        "tokenizer.ggml.eos_token_id": vocab[tok_config["eos_token"]],
        "tokenizer.ggml.padding_token_id": vocab[tok_config["pad_token"]],
        "tokenizer.chat_template": tok_config["chat_template"],
    }


# ---- MLX's writer --------------------------------------------------------------------


def save_mlx(path: Path, tensors: dict[str, np.ndarray], metadata: dict) -> Path:
    import mlx.core as mx

    def value(v):
        if isinstance(v, bool):
            return mx.array(v)
        if isinstance(v, int):
            return mx.array(v, dtype=mx.uint32)
        if isinstance(v, float):
            return mx.array(v, dtype=mx.float32)
        if isinstance(v, list) and v and isinstance(v[0], int):
            return mx.array(v, dtype=mx.int32)
        return v

    mx.save_gguf(str(path), {k: mx.array(w) for k, w in tensors.items()}, {k: value(v) for k, v in metadata.items()})
    return path


# ---- the raw writer, and llama.cpp's packed blocks -----------------------------------


def quantize_q4_0(w: np.ndarray) -> bytes:
    """llama.cpp's quantize_row_q4_0: per 32 weights, a float16 scale d from the value of
    largest magnitude (which maps to -8) and 4-bit codes q with w ~ (q - 8) * d."""
    x = w.reshape(-1, 32).astype(np.float32)
    peak = x[np.arange(len(x)), np.abs(x).argmax(axis=1)]
    d = peak / -8
    inv = np.divide(1, d, out=np.zeros_like(d), where=d != 0)
    q = np.minimum(15, (x * inv[:, None] + 8.5).astype(np.int8)).astype(np.uint8)
    packed = q[:, :16] | (q[:, 16:] << 4)
    return _blocks(d, packed)


def dequantize_q4_0(data: bytes, shape) -> np.ndarray:
    d, qs = _unblocks(data, 16)
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.float32) - 8
    return (q * d[:, None]).reshape(shape)


def quantize_q8_0(w: np.ndarray) -> bytes:
    x = w.reshape(-1, 32).astype(np.float32)
    d = np.abs(x).max(axis=1) / 127
    inv = np.divide(1, d, out=np.zeros_like(d), where=d != 0)
    return _blocks(d, np.round(x * inv[:, None]).astype(np.int8).view(np.uint8))


def dequantize_q8_0(data: bytes, shape) -> np.ndarray:
    d, qs = _unblocks(data, 32)
    return (qs.view(np.int8).astype(np.float32) * d[:, None]).reshape(shape)


def _blocks(d: np.ndarray, codes: np.ndarray) -> bytes:
    scale = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return np.concatenate([scale, codes], axis=1).tobytes()


def _unblocks(data: bytes, width: int) -> tuple[np.ndarray, np.ndarray]:
    raw = np.frombuffer(data, dtype=np.uint8).reshape(-1, 2 + width)
    return raw[:, :2].copy().view(np.float16)[:, 0].astype(np.float32), raw[:, 2:]


def encode(w: np.ndarray, kind: str) -> bytes:
    if kind == "F32":
        return w.astype(np.float32).tobytes()
    if kind == "Q4_0":
        return quantize_q4_0(w)
    if kind == "Q8_0":
        return quantize_q8_0(w)
    if kind == "BF16":  # truncated, so the bytes decode to exactly w's bfloat16 neighbours
        return (w.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    per, nbytes = _BLOCK_BYTES.get(kind, (32, 18))  # a type only there to be refused: any bytes
    return bytes(w.size // per * nbytes)


def decode(data: bytes, shape, kind: str) -> np.ndarray:
    return {"Q4_0": dequantize_q4_0, "Q8_0": dequantize_q8_0, "BF16": decode_bf16}[kind](data, shape)


def decode_bf16(data: bytes, shape) -> np.ndarray:
    return (np.frombuffer(data, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)


def _kv(key: str, v) -> bytes:
    def s(text: str) -> bytes:
        b = text.encode()
        return struct.pack("<Q", len(b)) + b

    if isinstance(v, str):
        body = struct.pack("<I", 8) + s(v)
    elif isinstance(v, bool):
        body = struct.pack("<I?", 7, v)
    elif isinstance(v, int):
        body = struct.pack("<II", 4, v)
    elif isinstance(v, float):
        body = struct.pack("<If", 6, v)
    elif v and isinstance(v[0], str):
        body = struct.pack("<IIQ", 9, 8, len(v)) + b"".join(s(x) for x in v)
    else:
        body = struct.pack("<IIQ", 9, 5, len(v)) + struct.pack(f"<{len(v)}i", *v)
    return s(key) + body


def save_raw(
    path: Path, tensors: dict[str, tuple[tuple[int, ...], str | int, bytes]], metadata: dict, align: int = 32
) -> Path:
    """A GGUF v3 file: tensors map a name to (MLX-order shape, type name or id, raw bytes)."""
    infos, data = b"", b""
    for name, (shape, kind, raw) in tensors.items():
        data += bytes(-len(data) % align)
        type_id = TYPE_IDS[kind] if isinstance(kind, str) else kind
        b = name.encode()
        infos += (
            struct.pack("<Q", len(b))
            + b
            + struct.pack("<I", len(shape))
            + b"".join(struct.pack("<Q", n) for n in reversed(shape))
            + struct.pack("<IQ", type_id, len(data))
        )
        data += raw
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    head += b"".join(_kv(k, v) for k, v in metadata.items()) + infos
    path.write_bytes(head + bytes(-len(head) % align) + data)
    return path


def packed_types(tensors: dict[str, np.ndarray], matrices: str = "Q4_0", tables: str = "Q8_0") -> dict[str, str]:
    """SmolLM2's mix: 4-bit layers, 8-bit token embedding (and output), float32 norms."""

    def kind(name: str, w: np.ndarray) -> str:
        if w.ndim == 1:
            return "F32"
        return tables if name.startswith(("token_embd", "output.")) else matrices

    return {name: kind(name, w) for name, w in tensors.items()}


# ---- whole files ---------------------------------------------------------------------


def build_tiny_gguf(out: Path, seed: int = 0, packed: bool = False, arch: str = "llama") -> tuple[Path, Path]:
    """(GGUF file, the mlx-lm folder with the same numbers). Float32 through MLX's writer;
    packed: Q4_0 layers and Q8_0 tables through the raw writer, and the folder's weights
    replaced by their exact dequantized values, so both hold the same model."""
    from tests.support.randmodel import build_random_model

    folder = build_random_model(out / f"tiny-random-{seed}", seed=seed)
    tensors = tensors_from_folder(folder)
    meta = metadata_from_folder(folder, f"Tiny Random {seed}", arch)
    if not packed:
        return save_mlx(out / f"tiny-random-{seed}.gguf", tensors, meta), folder
    kinds = packed_types(tensors)
    raw = {n: (w.shape, kinds[n], encode(w, kinds[n])) for n, w in tensors.items()}
    path = save_raw(out / f"tiny-random-{seed}.Q4_0.gguf", raw, meta)
    _write_dequantized(folder, raw)
    return path, folder


def _write_dequantized(folder: Path, raw: dict) -> None:
    import mlx.core as mx

    config = json.loads((folder / "config.json").read_text())
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    weights = dict(mx.load(str(folder / "model.safetensors")))
    for mlx_name in list(weights):
        shape, kind, data = raw[_gguf_name(mlx_name)]
        if kind == "F32":
            continue
        w = decode(data, shape, kind)
        part = _gguf_name(mlx_name).split(".")[-2]
        if part in heads:  # undo the rotary permutation: the folder keeps Hugging Face's rows
            w = _unpermute(w, heads[part])
        weights[mlx_name] = mx.array(w)
    mx.save_safetensors(str(folder / "model.safetensors"), weights)


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
