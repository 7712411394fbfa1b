"""Turn a llama-family GGUF file into an mlx-lm model folder, cached in the data folder.

Owns: reading a GGUF header (scalar metadata, tensor names, types and extents) to refuse,
in one line, what cannot be run before MLX reads the file; mapping llama.cpp's tensor names
and hyperparameters to mlx-lm's llama; rebuilding a Hugging Face tokenizer.json from the
GGUF vocabulary and merges; the cache of converted folders (<data>/models/<sha256[:16]>),
written through a temporary folder and one rename, so that a crash never leaves a half
folder that a later start trusts.

Leaves to others: loading the folder and choosing the dtype it runs in (`model.py`, which
dequantizes GGUF's packed weights on the CPU), printing (`doctor`, the CLI). Runs on the
engine thread at start-up, or in the CLI's thread for `radixchat doctor`.

The weights stay as MLX reads them: Q4_0, Q4_1 and Q8_0 packed (MLX's affine layout, group
32, float16 scales and biases), F32/F16 as they are, BF16 read here (MLX would narrow it to
float16), Q2_K and Q6_K as MLX's float16 decoding. Q4_K is refused: MLX's reader (gguf-tools)
decodes every second 32-weight sub-block with its neighbour's scale.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import shutil
import struct
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

CONVERTER_VERSION = 1  # bump when the folder's contents change: older folders convert again
MARKER = "gguf.json"  # written last; a folder without it (or of another version) is not trusted
GROUP_SIZE = 32  # llama.cpp's block of Q4_0, Q4_1 and Q8_0, which MLX keeps as its group size

TYPE_NAMES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    6: "Q5_0",
    7: "Q5_1",
    8: "Q8_0",
    9: "Q8_1",
    10: "Q2_K",
    11: "Q3_K",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
    15: "Q8_K",
    16: "IQ2_XXS",
    17: "IQ2_XS",
    18: "IQ3_XXS",
    19: "IQ1_S",
    20: "IQ4_NL",
    21: "IQ3_S",
    22: "IQ2_S",
    23: "IQ4_XS",
    24: "I8",
    25: "I16",
    26: "I32",
    27: "I64",
    28: "F64",
    29: "IQ1_M",
    30: "BF16",
    34: "TQ1_0",
    35: "TQ2_0",
    39: "MXFP4",
}
# (weights per block, bytes per block) of the types accepted; the rest are refused
BLOCKS = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q8_0": (32, 34),
    "Q2_K": (256, 84),
    "Q6_K": (256, 210),
}
_TYPES_OK = f"files of {', '.join(list(BLOCKS)[:-1])} or {list(BLOCKS)[-1]} tensors load"
MISREAD = {"Q4_K": "MLX's GGUF reader decodes wrongly (every second sub-block gets its neighbour's scale)"}

# GGUF metadata value types: struct formats of the fixed-size ones
_STRING, _ARRAY = 8, 9
_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

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

# llama.cpp's pre-tokenizer regexes (llm_tokenizer_bpe), applied one after another, each
# match isolated; byte-level BPE then runs inside every piece
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
    **dict.fromkeys(["gpt2", "gpt-2", "mpt", "olmo", "jais"], (_GPT2,)),
    **dict.fromkeys(
        ["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"], (r"\p{N}", _GPT2)
    ),
    **dict.fromkeys(["llama-bpe", "llama3", "dbrx", "smaug-bpe"], (_LLAMA3,)),
}
_IGNORE_MERGES = {"llama-bpe", "llama3", "dbrx", "smaug-bpe"}  # whole-word vocabulary hits first

_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values
_ROLE_KEYS = (
    ("bos", "bos_token"),
    ("eos", "eos_token"),
    ("padding", "pad_token"),
    ("unknown", "unk_token"),
)  # tokenizer.ggml.<role>_token_id -> tokenizer_config
_REQUIRED = ("llama.block_count", "llama.embedding_length", "llama.feed_forward_length", "llama.attention.head_count")
_QUANT_TAG = re.compile(r"[.\-_](?:i?q\d\w*|f16|f32|bf16)$", re.IGNORECASE)


class GGUFError(ValueError):
    """A GGUF file that cannot be run; the message is one line for the user."""


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]  # MLX order (GGUF stores the innermost dimension first)
    type: str
    offset: int  # from the start of the file


@dataclass
class Header:
    metadata: dict  # scalars and strings
    arrays: set[str]  # the keys of arrays, skipped here (mx.load reads them)
    tensors: list[Tensor]
    size: int


@dataclass
class GGUFInfo:
    """What doctor and the model's description say about a converted GGUF."""

    file: str
    model_id: str
    tensor_types: dict[str, int] = field(default_factory=dict)
    folder: str = ""  # the converted mlx-lm folder in the cache

    def types_line(self) -> str:
        return ", ".join(f"{t} x {n}" for t, n in sorted(self.tensor_types.items(), key=lambda kv: -kv[1]))


# ---- reading the header --------------------------------------------------------------


class _Reader:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, fmt: str):
        (val,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return val

    def string(self) -> str:
        n = self.take("Q")
        if self.pos + n > len(self.buf):
            raise struct.error("string past the end")
        self.pos += n
        return bytes(self.buf[self.pos - n : self.pos]).decode("utf-8", "replace")

    def value(self, vtype: int):
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            self.skip_array(self.take("I"), self.take("Q"))
            return None
        if vtype not in _FORMATS:
            raise struct.error(f"unknown value type {vtype}")
        return self.take(_FORMATS[vtype])

    def skip_array(self, etype: int, n: int) -> None:
        if etype in _FORMATS:
            self.pos += n * struct.calcsize("<" + _FORMATS[etype])
            if self.pos > len(self.buf):
                raise struct.error("array past the end")
            return
        for _ in range(n):  # strings and nested arrays have no fixed size
            self.value(etype)


def read_header(path: Path) -> Header:
    """The metadata and tensor table, checked against the file's size; GGUFError if not."""
    size = path.stat().st_size
    if size < 24:
        raise GGUFError(f"{path.name} is not a GGUF file (only {size} bytes)")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise GGUFError(f"{path.name} is not a GGUF file (it starts with {bytes(buf[:4])!r})")
        try:
            return _parse(_Reader(buf), size, path.name)
        except (struct.error, OverflowError) as e:
            raise GGUFError(
                f"{path.name} is truncated or corrupt: its header ends early or makes no sense ({e})"
            ) from None


def _parse(r: _Reader, size: int, name: str) -> Header:
    r.pos = 4
    version = r.take("I")
    if version not in (2, 3):
        raise GGUFError(f"{name}: GGUF version {version} is not supported (2 and 3 are)")
    n_tensors, n_kv = r.take("Q"), r.take("Q")
    metadata, arrays = {}, set()
    for _ in range(n_kv):
        key = r.string()
        val = r.value(r.take("I"))
        if val is None:
            arrays.add(key)
        else:
            metadata[key] = val
    tensors = [_tensor_info(r) for _ in range(n_tensors)]
    align = metadata.get("general.alignment") or 32
    data = r.pos + (-r.pos) % align
    for t in tensors:
        t.offset += data
    return Header(metadata, arrays, tensors, size)


def _tensor_info(r: _Reader) -> Tensor:
    name = r.string()
    ndim = r.take("I")
    if ndim > 4:
        raise struct.error(f"tensor {name} has {ndim} dimensions")
    dims = [r.take("Q") for _ in range(ndim)]
    type_id = r.take("I")
    return Tensor(name, tuple(reversed(dims)), TYPE_NAMES.get(type_id, f"type {type_id}"), r.take("Q"))


def _nbytes(t: Tensor) -> int:
    per_block, block_bytes = BLOCKS[t.type]
    n = 1
    for d in t.shape:
        n *= d
    return -(-n // per_block) * block_bytes


# ---- what can be run -----------------------------------------------------------------


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
    _check_tokenizer(meta, header.arrays, name)


def _check_tensor(t: Tensor, name: str, size: int) -> None:
    if t.name == "rope_freqs.weight":
        raise GGUFError(f"{name}: llama-3.1-style rope frequency factors (rope_freqs) are not supported")
    if t.type in MISREAD:
        raise GGUFError(f"{name}: tensor {t.name} is {t.type}, which {MISREAD[t.type]}; {_TYPES_OK}")
    if t.type not in BLOCKS:
        raise GGUFError(f"{name}: tensor {t.name} is {t.type}, which MLX's GGUF reader cannot read; {_TYPES_OK}")
    _mlx_name(t.name, name)
    end = t.offset + _nbytes(t)
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


def _check_tokenizer(meta: dict, arrays: set[str], name: str) -> None:
    if "tokenizer.ggml.tokens" not in arrays:
        raise GGUFError(f"{name}: the file has no vocabulary (tokenizer.ggml.tokens)")
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise GGUFError(
            f"{name}: tokenizer {model!r} is not supported; only byte-level BPE ('gpt2') vocabularies convert"
        )
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE:
        raise GGUFError(f"{name}: pre-tokenizer {pre!r} is not supported (known: {', '.join(sorted(_PRE))})")


def _mlx_name(gguf_name: str, name: str = "") -> str:
    module, _, leaf = gguf_name.rpartition(".")
    if module in _TOP:
        return f"{_TOP[module]}.{leaf}"
    parts = module.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _BLOCK:
        return f"model.layers.{parts[1]}.{_BLOCK[parts[2]]}.{leaf}"
    raise GGUFError(f"{name}: tensor {gguf_name} has no place in mlx-lm's llama")


# ---- converting ----------------------------------------------------------------------


def model_id(path: Path) -> str:
    """The file's stem without its quantization tag: general.name is often generated
    ("Smollm2 135M 8k Lc100K Mix1 Ep2") where the file name is what the user chose."""
    return _QUANT_TAG.sub("", path.stem) or path.stem


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
        data = np.frombuffer(f.read(_nbytes(t)), dtype=np.uint16)
    return mx.array(data).view(mx.bfloat16).reshape(t.shape)


# ---- the tokenizer -------------------------------------------------------------------


def build_tokenizer(meta: dict, out: Path, context_length: int) -> list[int]:
    """tokenizer.json and tokenizer_config.json from the GGUF vocabulary; returns the
    end-of-sequence token ids for config.json."""
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = _ints(meta.get("tokenizer.ggml.token_type")) or [1] * len(tokens)
    tok = _bpe(tokens, list(meta.get("tokenizer.ggml.merges", [])), meta.get("tokenizer.ggml.pre", "default"))
    _add_tokens(tok, tokens, types)
    named = {
        role: _scalar(meta.get(f"tokenizer.ggml.{role}_token_id"))
        for role in ("bos", "eos", "padding", "unknown", "eot", "eom")
    }
    named = {role: i for role, i in named.items() if i is not None and 0 <= i < len(tokens)}
    if _scalar(meta.get("tokenizer.ggml.add_bos_token")) and "bos" in named:
        from tokenizers import processors

        bos = tokens[named["bos"]]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, named["bos"])]
        )
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": context_length,
        "clean_up_tokenization_spaces": False,
    }
    for role, key in _ROLE_KEYS:
        if role in named:
            config[key] = tokens[named[role]]
    if "tokenizer.chat_template" in meta:
        config["chat_template"] = meta["tokenizer.chat_template"]
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    return list(dict.fromkeys(named[r] for r in ("eos", "eot", "eom") if r in named))


def _bpe(tokens: list[str], merges: list[str], pre: str):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre in _IGNORE_MERGES))
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _PRE[pre]]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def _add_tokens(tok, tokens: list[str], types: list[int]) -> None:
    """Control tokens (the chat template's markers) become special tokens, matched whole and
    never split; user-defined ones are matched whole but decode like text."""
    from tokenizers import AddedToken

    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == _CONTROL]
    )
    tok.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == _USER_DEFINED]
    )


def _scalar(v):
    return v.item() if hasattr(v, "item") else v


def _ints(v) -> list[int]:
    return [] if v is None else (v.tolist() if hasattr(v, "tolist") else list(v))


# ---- the cache -----------------------------------------------------------------------


def file_key(path: Path) -> str:
    """sha256 of the whole file (0.1 s for 98 MB here): a file edited in place, even with
    its size and mtime kept, converts anew."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def cache_root() -> Path:
    from radixchat.core.config import default_data_dir

    return default_data_dir() / "models"


def converted_folder(path: Path, root: Path | None = None) -> tuple[Path, GGUFInfo]:
    """The mlx-lm folder of this GGUF file: from the cache, or converted into it now."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    digest = file_key(path)
    folder = (root or cache_root()) / digest[:16]
    info = _trusted(folder)
    if info is None:
        info = _convert_into(path, folder, digest)
    info.file, info.folder = str(path), str(folder)  # the same bytes may sit under another name
    return folder, info


def _trusted(folder: Path) -> GGUFInfo | None:
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if marker.get("converter") != CONVERTER_VERSION:
        return None
    return GGUFInfo(marker["file"], marker["model_id"], marker["tensor_types"])


def _convert_into(path: Path, folder: Path, digest: str) -> GGUFInfo:
    folder.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(folder)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        info = convert(path, tmp, digest)
        _publish(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return info


def _remove_stale_temps(folder: Path, age_s: float = 3600) -> None:
    """A conversion killed midway leaves its temporary folder; one an hour old is dead."""
    for old in folder.parent.glob(f".{folder.name}-*"):
        try:
            if time.time() - old.stat().st_mtime > age_s:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass


def _publish(tmp: Path, folder: Path) -> None:
    """One rename makes the folder appear whole. Another process that converted the same
    file first wins; an out-of-date folder is moved aside, then removed."""
    if folder.exists() and _trusted(folder) is None:
        aside = folder.with_name(f".{folder.name}-old-{os.getpid()}")
        os.rename(folder, aside)
        shutil.rmtree(aside, ignore_errors=True)
    try:
        os.rename(tmp, folder)
    except OSError:
        if _trusted(folder) is None:
            raise


def convert(path: Path, out: Path, digest: str = "") -> GGUFInfo:
    """Write the mlx-lm folder of `path` into `out` (an empty folder); the marker last."""
    import mlx.core as mx

    header = read_header(path)
    check(header, path.name)
    source = _readable(path, out)
    try:
        weights, meta = load_weights(source, header)
    finally:
        if source != path:
            source.unlink()
    info = GGUFInfo(str(path), model_id(path), dict(Counter(t.type for t in header.tensors)))
    config = model_config(header, weights, info.model_id)
    config["eos_token_id"] = build_tokenizer(meta, out, config["max_position_embeddings"])
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / MARKER).write_text(
        json.dumps(
            {
                "converter": CONVERTER_VERSION,
                "file": info.file,
                "sha256": digest,
                "model_id": info.model_id,
                "general.name": header.metadata.get("general.name"),
                "tensor_types": info.tensor_types,
            },
            indent=2,
        )
    )
    return info


def _readable(path: Path, scratch: Path) -> Path:
    """MLX opens a GGUF file read-write (gguf-tools maps it shared and writable), so a file
    the user may only read is copied first."""
    if os.access(path, os.W_OK):
        return path
    copy = scratch / "source.gguf"
    shutil.copyfile(path, copy)
    return copy
