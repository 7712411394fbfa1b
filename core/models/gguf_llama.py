"""llama.cpp's llama in mlx-lm's terms: what can be run, the weights and config.json.

Owns: refusing, in one line, what this converter or MLX cannot run correctly (`check`, before
MLX reads the file), mapping llama.cpp's tensor names and hyperparameters to mlx-lm's llama
(`load_weights`, `model_config`, its `quantization` entry). Leaves to others: the header
(`gguf_file.py`), the vocabulary (`gguf_tokenizer.py`), writing and caching the folder
(`gguf.py`), the dtype the model runs in (`model.py`). Runs in whichever thread converts: the
engine thread at start-up, or the CLI's for `radixchat doctor`.

The weights stay as MLX reads them: Q4_0, Q4_1 and Q8_0 packed (MLX's affine layout, group
32, float16 scales and biases), F32/F16 as they are, BF16 read here (MLX would narrow it to
float16), Q2_K and Q6_K as MLX's float16 decoding. Q4_K is refused: MLX's reader (gguf-tools)
decodes every second 32-weight sub-block with its neighbour's scale.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from radixchat.core.models.gguf_file import BLOCKS, GGUFError, Header, Tensor, nbytes
from radixchat.core.models.gguf_tokenizer import check_tokenizer

GROUP_SIZE = 32  # llama.cpp's block of Q4_0, Q4_1 and Q8_0, which MLX keeps as its group size
_TYPES_OK = f"files of {', '.join(list(BLOCKS)[:-1])} or {list(BLOCKS)[-1]} tensors load"
MISREAD = {"Q4_K": "MLX's GGUF reader decodes wrongly (every second sub-block gets its neighbour's scale)"}
_REQUIRED = ("llama.block_count", "llama.embedding_length", "llama.feed_forward_length", "llama.attention.head_count")

# llama.cpp's tensor names -> mlx-lm's llama module paths
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def check(header: Header, name: str) -> None:
    """Refuse, in one line, what this converter or MLX cannot run correctly."""
    meta = header.metadata
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise GGUFError(
            f"{name}: architecture {arch!r} is not llama-family; only llama GGUF "
            "files convert (other models: an mlx-lm model folder)"
        )
    if meta.get("llama.expert_count", 0) > 0:
        raise GGUFError(f"{name}: a mixture-of-experts llama (Mixtral-style) is not supported")
    missing = [k for k in _REQUIRED if k not in meta]
    if missing or "token_embd.weight" not in {t.name for t in header.tensors}:
        raise GGUFError(f"{name}: not a complete llama model (missing {', '.join(missing) or 'token_embd.weight'})")
    for t in header.tensors:
        _check_tensor(t, name, header.size)
    _check_rope(meta, header, name)
    check_tokenizer(meta, header.arrays, name)


def _check_tensor(t: Tensor, name: str, size: int) -> None:
    if t.name == "rope_freqs.weight":
        raise GGUFError(f"{name}: llama-3.1-style rope frequency factors (rope_freqs) are not supported")
    if t.type in MISREAD:
        raise GGUFError(f"{name}: tensor {t.name} is {t.type}, which {MISREAD[t.type]}; {_TYPES_OK}")
    if t.type not in BLOCKS:
        raise GGUFError(f"{name}: tensor {t.name} is {t.type}, which MLX's GGUF reader cannot read; {_TYPES_OK}")
    _mlx_name(t.name, name)
    end = t.offset + nbytes(t)
    if end > size:
        raise GGUFError(
            f"{name} is truncated: tensor {t.name} ends at byte {end:,} but the "
            f"file has {size:,} (an incomplete download?)"
        )


def _check_rope(meta: dict, header: Header, name: str) -> None:
    scaling = meta.get("llama.rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise GGUFError(f"{name}: rope scaling {scaling!r} is not supported")
    heads = meta.get("llama.attention.head_count", 0)
    head_dim = meta.get("llama.attention.key_length") or (
        meta.get("llama.embedding_length", 0) // heads if heads else 0
    )
    rope_dims = meta.get("llama.rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise GGUFError(
            f"{name}: rope over {rope_dims} of {head_dim} head dimensions (partial rotary) is not supported"
        )


def _mlx_name(gguf_name: str, name: str = "") -> str:
    module, _, leaf = gguf_name.rpartition(".")
    if module in _TOP:
        return f"{_TOP[module]}.{leaf}"
    parts = module.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _BLOCK:
        return f"model.layers.{parts[1]}.{_BLOCK[parts[2]]}.{leaf}"
    raise GGUFError(f"{name}: tensor {gguf_name} has no place in mlx-lm's llama")


def model_config(header: Header, weights: dict, name_or_path: str) -> dict:
    meta = header.metadata
    get = lambda key, default=None: meta.get(f"llama.{key}", default)  # noqa: E731
    heads = get("attention.head_count")
    config = {
        "model_type": "llama",
        "_name_or_path": name_or_path,
        "hidden_size": get("embedding_length"),
        "num_hidden_layers": get("block_count"),
        "intermediate_size": get("feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads),
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": get("rope.freq_base", 10000.0),
        "max_position_embeddings": get("context_length", 4096),
        "vocab_size": weights["model.embed_tokens.weight"].shape[0],
        # GGUF stores Q and K rows permuted for llama.cpp's interleaved rotary layout;
        # traditional RoPE rotates the same pairs, so nothing needs permuting back
        "rope_traditional": True,
        "tie_word_embeddings": "lm_head.weight" not in weights,
        "attention_bias": "model.layers.0.self_attn.q_proj.bias" in weights,
        "mlp_bias": "model.layers.0.mlp.up_proj.bias" in weights,
    }
    if get("attention.key_length"):
        config["head_dim"] = get("attention.key_length")
    if get("rope.scaling.type") == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": get("rope.scaling.factor", 1.0)}
    config.update(_quantization(weights))
    return config


def _packed_bits(weights: dict) -> dict[str, int]:
    """Bits of each packed module: a row of n weights packs into n * bits / 32 uint32 words
    beside n / 32 scales, so there are `bits` words per scale."""
    return {
        k.removesuffix(".scales"): weights[k.removesuffix("scales") + "weight"].shape[-1] // s.shape[-1]
        for k, s in weights.items()
        if k.endswith(".scales")
    }


def _quantization(weights: dict) -> dict:
    """mlx-lm's `quantization` entry: the commonest bits as the default, a per-module entry
    for the others (Q8_0 token embeddings beside Q4 layers)."""
    bits = _packed_bits(weights)
    if not bits:
        return {}
    default = Counter(bits.values()).most_common(1)[0][0]
    q = {"group_size": GROUP_SIZE, "bits": default}
    q.update({p: {"group_size": GROUP_SIZE, "bits": b} for p, b in sorted(bits.items()) if b != default})
    return {"quantization": q, "quantization_config": q}


def load_weights(path: Path, header: Header) -> tuple[dict, dict]:
    """MLX's reading of the file, in mlx-lm's names, and the full metadata (arrays too)."""
    import mlx.core as mx

    try:
        raw, meta = mx.load(str(path), return_metadata=True)
    except Exception as e:  # MLX reports every failure as a generic error
        why = str(e).removeprefix("[load_gguf] ")
        raise GGUFError(f"{path.name}: MLX could not read it: {why}") from None
    for t in header.tensors:
        if t.type == "BF16":
            raw[t.name] = _read_bf16(path, t)
    # packed tensors come as NAME.weight (uint32) beside NAME.scales and NAME.biases
    return {_mlx_name(k, path.name): v for k, v in raw.items()}, meta


def _read_bf16(path: Path, t: Tensor):
    """MLX narrows BF16 to float16 (overflow past 65504, lost small values); read it as is."""
    import mlx.core as mx
    import numpy as np

    with open(path, "rb") as f:
        f.seek(t.offset)
        data = np.frombuffer(f.read(nbytes(t)), dtype=np.uint16)
    return mx.array(data).view(mx.bfloat16).reshape(t.shape)
