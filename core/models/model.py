"""Load a chat model with mlx-lm and describe it.

`load_model` takes a local mlx-lm folder, a llama-family GGUF file (converted once into an
mlx-lm folder by `gguf.py`, cached in the data folder) or a hub id (hub ids need the network
the first time; tests only ever pass local folders and files). On the CPU it casts floating
weights to float32, since half precision gets no BLAS there; a GGUF's packed 4/8-bit weights
are dequantized there too, since MLX's quantized CPU kernels are ~10x slower than float32
with OpenBLAS. On a GPU (a Mac's, or an NVIDIA one through mlx-cuda-13) packed weights stay
packed and float32 ones become bfloat16. Runs on the engine thread (or the CLI's, for
`radixchat doctor`); running the model is the engine's job.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map

from radixchat.core.models.catalog import Card, card_of_folder, resolve
from radixchat.core.models.gguf import GGUFInfo, converted_folder

log = logging.getLogger("radixchat.models")
_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: Any  # mlx_lm TokenizerWrapper
    model_id: str
    context_length: int
    num_params: int
    dtype: str
    num_layers: int
    vocab_size: int  # rows of the output logits: the largest top_k a sampler can take
    # the longest token's text in characters: no text longer than context_length times this
    # fits in the context, whatever it says (0: unknown, no such bound)
    max_token_chars: int = 0
    gguf: GGUFInfo | None = None  # the source file, when the model came from a GGUF
    runs_as: str = ""  # the dtype it computes in, and whether packed weights stay packed
    card: Card | None = None  # name, size, license, note, recommended sampling (core.models.catalog)
    notice: str = ""  # said once at start-up, e.g. that the default model fell back to the tiny one
    weights_bytes: int = 0  # what its weights take in memory, as loaded


def _context_length(config: dict) -> int:
    for key in ("max_position_embeddings", "max_seq_len", "n_positions", "seq_length", "sliding_window"):
        val = config.get(key) or config.get("text_config", {}).get(key)
        if isinstance(val, int) and val > 0:
            return val
    return 4096


def on_gpu() -> bool:
    """Does MLX run on a GPU here (a Mac's Metal, or CUDA where mlx-cuda-13 is installed)?"""
    return mx.default_device() == mx.gpu


def _target_dtype(requested: str, gpu: bool) -> mx.Dtype:
    """What floating weights are cast to. `auto` is float32 on a CPU (half precision gets no
    BLAS there) and bfloat16 on a GPU, where float32 weights would double the bytes every step
    reads; a checkpoint already in float16 or bfloat16 keeps its own there (`_cast`)."""
    if requested != "auto":
        return _DTYPES[requested]
    return mx.bfloat16 if gpu else mx.float32


def _cast(a: mx.array, target: mx.Dtype, only_float32: bool) -> mx.array:
    if not mx.issubdtype(a.dtype, mx.floating) or (only_float32 and a.dtype != mx.float32):
        return a
    return a.astype(target)


def _is_gguf(local: Path) -> bool:
    if local.suffix.lower() == ".gguf":
        return True
    try:
        with open(local, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:  # a folder, or nothing there
        return False


def _dequantize(model: nn.Module) -> None:
    """Packed layers become float ones, their scales and biases in float32 first so the
    weights come out exact (not rounded to the float16 of the scales)."""
    from mlx_lm.utils import dequantize_model

    up = lambda a: a.astype(mx.float32) if mx.issubdtype(a.dtype, mx.floating) else a  # noqa: E731
    model.update(tree_map(up, model.parameters()))
    dequantize_model(model)


def _runs_as(model: nn.Module, dtype: str) -> str:
    bits = sorted({m.bits for _, m in model.named_modules() if hasattr(m, "bits")})
    if bits:
        return f"{'/'.join(map(str, bits))}-bit packed weights, {dtype} scales"
    return dtype


def load_model(path_or_id: str, dtype: str = "auto", context_length: int | None = None, link=None) -> LoadedModel:
    """With `link` (core.engine.shard.lockstep.Link: a rank of an mlx.launch group) only this
    rank's shard of the weights is kept; the parameter count stays the whole model's."""
    from mlx_lm import load

    chosen = resolve(path_or_id)  # short names: default, smollm2, tiny
    if chosen.notice:
        log.warning(chosen.notice)
    path_or_id = chosen.path
    local = Path(path_or_id).expanduser()
    gguf = None
    if _is_gguf(local):
        folder, gguf = converted_folder(local)
        path_or_id = str(folder)
    elif path_or_id.startswith(("/", ".", "~")) or path_or_id.count("/") > 1:
        if not (local / "config.json").is_file():
            raise FileNotFoundError(f"no mlx-lm model folder (with config.json) at {local}")
        path_or_id = str(local)
    model, tokenizer, config = load(path_or_id, return_config=True, lazy=link is not None)
    whole = None
    if link is not None:
        from radixchat.core.models.sharding import shard_model

        whole = sum(v.size for _, v in tree_flatten(model.parameters()))  # shapes only: still lazy
        link.sharding = shard_model(model, link)
    gpu = on_gpu()
    target = _target_dtype(dtype, gpu)
    keep_packed = gpu and dtype == "auto"  # a GPU runs packed weights at their own speed
    if gguf is not None and not keep_packed:
        _dequantize(model)
    model.update(tree_map(lambda a: _cast(a, target, keep_packed), model.parameters()))
    mx.eval(model.parameters())
    params = tree_flatten(model.parameters())
    num_params = whole or sum(v.size for _, v in params)
    first_float = next((v.dtype for _, v in params if mx.issubdtype(v.dtype, mx.floating)), mx.float32)
    # a local folder is named by its config's _name_or_path (as Hugging Face writes it), else by itself
    model_id = (config.get("_name_or_path") or Path(path_or_id).name) if Path(path_or_id).exists() else path_or_id
    dtype_name = str(first_float).removeprefix("mlx.core.")
    if chosen.card is not None:
        model_id = chosen.card.name
    card = chosen.card or card_of_folder(local if local.is_dir() else Path(path_or_id), model_id, num_params)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        model_id=model_id,
        context_length=context_length or _context_length(config),
        num_params=num_params,
        dtype=dtype_name,
        num_layers=len(getattr(model, "layers", [])),
        vocab_size=_vocab_size(config, tokenizer),
        max_token_chars=_max_token_chars(tokenizer),
        gguf=gguf,
        runs_as=_runs_as(model, dtype_name),
        card=card,
        notice=chosen.notice,
        weights_bytes=sum(v.nbytes for _, v in params),
    )


def _vocab_size(config: dict, tokenizer) -> int:
    val = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
    return val if isinstance(val, int) and val > 0 else len(tokenizer.vocab)


def _max_token_chars(tokenizer) -> int:
    """The most characters one token of `tokenizer` stands for: the longest entry of its
    vocabulary, special and added tokens included. A byte-level BPE entry has a character
    per byte (at least as many as its text has); a SentencePiece entry is its text, a byte
    fallback (<0x0A>) longer than its one byte. 0 when the vocabulary can't be read."""
    try:
        return max((len(t) for t in tokenizer.vocab), default=0)
    except (AttributeError, TypeError, NotImplementedError):
        return 0
