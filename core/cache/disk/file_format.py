"""What one file of the disk tier holds, and turning a node into those bytes and back.

A file holds one node's own tokens (its K/V, `k{i}`/`v{i}` per plain K/V layer, exactly n
long; at a --kv-bits precision their codes and scales, `k{i}`, `ks{i}`, `v{i}`, `vs{i}`),
the snapshot of the other layers at its end if the node has one (their state's arrays, its
structure in the metadata, restored into the class this model's layer has, never one a
file names) and, in its metadata, the whole tree key up to its end: a restart places it
under the entries that hold its prefix. Tagged tokens (a user's private
namespace, core/cache/scope.py) are written with the owner's name, since namespace numbers
are this process's, and retagged through the scope when read back (`key_of`).

Owns: the format (`FORMAT`, `EntryFormat`: the metadata, `to_bytes`, `layers`). Left to
others: which file is whose (files.py), when to write and read (tier.py), the file's
name, checksum and I/O (fileio.py). Runs in the engine thread, which alone turns arrays
into bytes (`mx.save_safetensors` into memory) and back; `key_of` also at start-up.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from radixchat.core.cache.disk.fileio import Corrupt
from radixchat.core.cache.kv import Snapshot
from radixchat.core.cache.radix import Node

FORMAT = "1"
TAG_SHIFT, TOKEN_MASK = 32, (1 << 32) - 1  # core.cache.scope's tags: token + namespace << 32


@dataclass
class EntryFormat:
    """The files of one model (its fingerprint) under one --cache-sharing."""

    fingerprint: str
    sharing: str
    trimmable: list[bool]  # per layer: plain K/V (in the file by token) or a snapshot's
    classes: list[type]  # this model's cache class per layer, the only ones a snapshot becomes
    quantized: bool = False  # plain K/V as codes and scales (--kv-bits: core.cache.kv_format)

    @property
    def names(self) -> tuple[str, ...]:
        """What a plain layer's arrays are called in a file (with the layer's number after)."""
        return ("k", "ks", "v", "vs") if self.quantized else ("k", "v")

    def matches(self, meta: dict) -> bool:
        """Was the file with this metadata written for this model and sharing mode?"""
        return (meta.get("format"), meta.get("fingerprint"), meta.get("sharing")) == (
            FORMAT,
            self.fingerprint,
            self.sharing,
        )

    def to_bytes(self, node: Node, key: list[int], start: int, owner: str | bool) -> bytes:
        """`node`'s file: `key` is the tree key up to its end, `start` where its own tokens
        begin, `owner` the name tagged tokens belong to (True for an untagged key)."""
        arrays = {}
        for i, kv in enumerate(node.seg.layers):
            if kv is not None:
                arrays.update({f"{name}{i}": a for name, a in zip(self.names, kv, strict=True)})
        meta = {
            "format": FORMAT,
            "fingerprint": self.fingerprint,
            "sharing": self.sharing,
            "start": str(start),
            "n": str(len(node.key)),
            "key": json.dumps(key),
        }
        if owner is not True:
            meta["owner"] = owner
        if node.snapshot is not None:
            meta["snapshot"] = json.dumps(
                [
                    None
                    if layer is None
                    else {"cls": layer[0].__name__, "state": _flatten(layer[1], arrays, f"s{i}"), "meta": layer[2]}
                    for i, layer in enumerate(node.snapshot.layers)
                ]
            )
        buf = io.BytesIO()
        mx.save_safetensors(buf, arrays, metadata=meta)
        return buf.getvalue()

    def layers(self, result, n: int, snap: bool) -> tuple[dict[int, tuple], Snapshot | None]:
        """A file the reader read (`result`: numpy arrays, metadata, the bfloat16 names) as
        MLX arrays: each plain layer's (K, V) of exactly `n` tokens and, with `snap`, the
        snapshot. Raises Corrupt (or KeyError, ValueError, TypeError) for a file that is
        not what its name and size say."""
        arrays, meta, bf16 = result
        if meta.get("fingerprint") != self.fingerprint or int(meta.get("n", -1)) != n:
            raise Corrupt("another model's entry")
        mxa = {name: mx.array(a).view(mx.bfloat16) if name in bf16 else mx.array(a) for name, a in arrays.items()}
        kv = {}
        for i, t in enumerate(self.trimmable):
            if t:
                parts = tuple(mxa[f"{name}{i}"] for name in self.names)
                if any(a.ndim != 4 or a.shape[2] != n for a in parts) or parts[0].shape != parts[len(parts) // 2].shape:
                    raise Corrupt(f"layer {i} holds {parts[0].shape}, not {n} tokens")
                kv[i] = parts
        return kv, self._snapshot_of(meta, mxa) if snap else None

    def _snapshot_of(self, meta: dict, arrays: dict) -> Snapshot:
        layers = []
        for i, entry in enumerate(json.loads(meta["snapshot"])):
            if entry is None:
                layers.append(None)
                continue
            cls = self.classes[i]  # this model's own class for the layer, never a name from a file
            if self.trimmable[i] or entry["cls"] != cls.__name__:
                raise Corrupt(f"layer {i}: a {entry['cls']} snapshot for a {cls.__name__}")
            meta_state = entry["meta"]
            layers.append(
                (
                    cls,
                    _unflatten(entry["state"], arrays),
                    tuple(meta_state) if isinstance(meta_state, list) else meta_state,
                )
            )
        return Snapshot.of_layers(layers)


def key_of(meta: dict, tag_of: Callable[[str], int]) -> tuple[list[int], int]:
    """A file's tree key and where its own tokens start, its tagged tokens retagged with
    `tag_of(owner)`, this process's tag for the owner the file names."""
    key, start = json.loads(meta["key"]), int(meta["start"])
    if not (0 <= start < len(key)) or int(meta["n"]) != len(key) - start:
        raise ValueError("inconsistent key")
    if any(t >> TAG_SHIFT for t in key):
        tag = tag_of(meta["owner"])
        key = [(t & TOKEN_MASK) | tag if t >> TAG_SHIFT else t for t in key]
    return key, start


def _flatten(x, arrays: dict, prefix: str):
    """A cache state (nested tuples and lists of arrays, ints, None) as JSON, its arrays
    put in `arrays` under names starting with `prefix`."""
    if isinstance(x, mx.array):
        name = f"{prefix}.{len(arrays)}"
        arrays[name] = x
        return {"a": name}
    if isinstance(x, (list, tuple)):
        return {"t" if isinstance(x, tuple) else "l": [_flatten(v, arrays, prefix) for v in x]}
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    raise TypeError(f"cannot write a {type(x).__name__} in a cache state")


def _unflatten(x, arrays: dict):
    if isinstance(x, dict):
        if "a" in x:
            return arrays[x["a"]]
        if "t" in x:
            return tuple(_unflatten(v, arrays) for v in x["t"])
        return [_unflatten(v, arrays) for v in x["l"]]
    return x
