"""The GGUF container: its header (scalar metadata, tensor names, types and extents), read
without MLX and checked against the file's size.

Owns: the tensor type table (`TYPE_NAMES`), the types whose blocks this converter accepts and
their sizes (`BLOCKS`), `read_header` and the one error every GGUF module raises (`GGUFError`,
a one-line message for the user). Leaves to others: whether llama.cpp's names and
hyperparameters fit mlx-lm's llama (`gguf_llama.py`), the vocabulary (`gguf_tokenizer.py`), the
converted folders (`gguf.py`). Runs in whichever thread converts: the engine thread at
start-up, or the CLI's for `radixchat doctor`.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

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

# GGUF metadata value types: struct formats of the fixed-size ones
_STRING, _ARRAY = 8, 9
_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


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


def nbytes(t: Tensor) -> int:
    """The bytes of `t`'s data in the file (a type of `BLOCKS`)."""
    per_block, block_bytes = BLOCKS[t.type]
    n = 1
    for d in t.shape:
        n *= d
    return -(-n // per_block) * block_bytes
