"""Which model a disk cache entry belongs to: one fingerprint of everything that shapes K/V.

K/V written by one model must never be read back by another, nor by the same model after
a file of it was edited. The fingerprint hashes (sha256) the model folder's weights and
config bytes, with the dtype the model computes in, the context length, the layers' cache
layout and the MLX and mlx-lm versions (a new kernel may round differently, and greedy
replies must stay equal with the cache on and off). Folders over FULL_HASH_BYTES are
fingerprinted by size, mtime and their first and last MiB instead of every byte (measured:
a full sha256 of SmolLM2's 98 MB folder costs 0.13 s at start-up; 8 GB would cost ~10 s).

Pure Python (hashlib); the engine thread calls it once when the disk tier opens.
"""

from __future__ import annotations

import hashlib
import json
from importlib.metadata import version
from pathlib import Path

FULL_HASH_BYTES = 2 << 30
_EDGE = 1 << 20
_WEIGHTS = (".safetensors", ".gguf", ".npz", ".bin")
_CONFIGS = ("config.json",)


def model_files(folder: Path) -> list[Path]:
    """The files whose bytes decide the K/V: weights and the model's config."""
    return sorted(p for p in folder.iterdir() if p.is_file() and (p.suffix in _WEIGHTS or p.name in _CONFIGS))


def fingerprint(folder: Path, layout: dict) -> str:
    """A hex digest naming the K/V `folder`'s model computes under `layout` (dtype, context
    length, which layers are plain K/V, ...: anything that changes what a K/V file holds)."""
    h = hashlib.sha256()
    files = model_files(folder)
    full = sum(p.stat().st_size for p in files) <= FULL_HASH_BYTES
    for p in files:
        st = p.stat()
        h.update(f"{p.name}\0{st.st_size}\0".encode())
        with open(p, "rb") as f:
            if full:
                h.update(hashlib.file_digest(f, "sha256").digest())
            else:
                h.update(str(st.st_mtime_ns).encode())
                h.update(f.read(_EDGE))
                f.seek(max(0, st.st_size - _EDGE))
                h.update(f.read(_EDGE))
    layout = dict(layout, mlx=version("mlx"), mlx_lm=version("mlx-lm"))
    h.update(json.dumps(layout, sort_keys=True).encode())
    return h.hexdigest()
