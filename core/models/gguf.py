"""Turn a llama-family GGUF file into an mlx-lm model folder, cached in the data folder.

Owns: the cache of converted folders (<data>/models/<sha256[:16]>), written through a
temporary folder and one rename, so that a crash never leaves a half folder that a later
start trusts; `convert`, which writes one folder (weights, config.json, the tokenizer, the
marker last); what doctor and the model's description say about it (`GGUFInfo`). Callers
import from here alone: the other GGUF modules' public names (`GGUFError`, `read_header`,
`check`, ...) are named here too.

Leaves to others: the header (`gguf_file.py`), what can be run and the weights in mlx-lm's
llama terms (`gguf_llama.py`), the tokenizer (`gguf_tokenizer.py`), loading the folder and
choosing the dtype it runs in (`model.py`, which dequantizes GGUF's packed weights on the
CPU), printing (`doctor`, the CLI). Runs on the engine thread at start-up, or in the CLI's
thread for `radixchat doctor`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from radixchat.core.models.gguf_file import BLOCKS, TYPE_NAMES, GGUFError, Header, Tensor, read_header
from radixchat.core.models.gguf_llama import GROUP_SIZE, MISREAD, check, load_weights, model_config
from radixchat.core.models.gguf_tokenizer import build_tokenizer

__all__ = [
    "BLOCKS",
    "CONVERTER_VERSION",
    "GROUP_SIZE",
    "MARKER",
    "MISREAD",
    "TYPE_NAMES",
    "GGUFError",
    "GGUFInfo",
    "Header",
    "Tensor",
    "build_tokenizer",
    "cache_root",
    "check",
    "convert",
    "converted_folder",
    "file_key",
    "load_weights",
    "model_config",
    "model_id",
    "read_header",
]

CONVERTER_VERSION = 1  # bump when the folder's contents change: older folders convert again
MARKER = "gguf.json"  # written last; a folder without it (or of another version) is not trusted
_QUANT_TAG = re.compile(r"[.\-_](?:i?q\d\w*|f16|f32|bf16)$", re.IGNORECASE)


@dataclass
class GGUFInfo:
    """What doctor and the model's description say about a converted GGUF."""

    file: str
    model_id: str
    tensor_types: dict[str, int] = field(default_factory=dict)
    folder: str = ""  # the converted mlx-lm folder in the cache

    def types_line(self) -> str:
        return ", ".join(f"{t} x {n}" for t, n in sorted(self.tensor_types.items(), key=lambda kv: -kv[1]))


def model_id(path: Path) -> str:
    """The file's stem without its quantization tag: general.name is often generated
    ("Smollm2 135M 8k Lc100K Mix1 Ep2") where the file name is what the user chose."""
    return _QUANT_TAG.sub("", path.stem) or path.stem


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
