"""The disk tier's bookkeeping: which node's K/V is in which file, and the tier's counters.

Owns: `DiskFile` (one file, or one being written: its size, tokens, state and the ranges of
it that nodes refer to), `DiskRef` (one node's range of a file, the `disk` of a radix.Node;
splitting a node splits its range, no I/O) and `DiskStats`. A file no range refers to any
more is handed to the callback its tier gave it, which deletes it. Left to others: the tree
that holds the references (radix.py), what a file holds (file_format.py), the tier that
writes, reads and deletes files (tier.py). Engine thread only, as the tree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixchat.core.cache.radix import Node


class DiskFile:
    """One file (or one being written): which nodes refer to which of its tokens."""

    __slots__ = ("data", "dig", "n", "nbytes", "owner", "path", "refs", "seq", "snap", "state", "unused")

    def __init__(self, unused: Callable[[DiskFile], None], seq: int, nbytes: int, n: int, state: str):
        # `unused(self)` once no node refers to it (the tier deletes it)
        self.unused, self.seq, self.nbytes, self.n, self.state = unused, seq, nbytes, n, state
        self.path: Path | None = None
        self.dig = ""
        self.refs: set[DiskRef] = set()
        self.data: bytes | None = None  # its bytes until the writer has written them
        self.snap = False  # holds the snapshot of the non-trimmable layers at its end
        self.owner: str | None = None  # whose private entry it is (charged to them); None: shared

    def ref(self, start: int, n: int) -> DiskRef:
        r = DiskRef(self, start, n)
        self.refs.add(r)
        return r


class DiskRef:
    """Tokens start..start+n of a file: one node's K/V on disk (radix.Node.disk)."""

    __slots__ = ("file", "n", "node", "start")

    def __init__(self, file: DiskFile, start: int, n: int):
        self.file, self.start, self.n = file, start, n
        self.node: Node | None = None  # kept by the tree

    @property
    def snap(self) -> bool:
        """Does reading it back bring a snapshot (the file has one, at this range's end)?"""
        return self.file.snap and self.start + self.n == self.file.n

    def split(self, k: int) -> tuple[DiskRef, DiskRef]:
        self.file.refs.discard(self)
        return self.file.ref(self.start, k), self.file.ref(self.start + k, self.n - k)

    def release(self) -> None:
        self.file.refs.discard(self)
        if not self.file.refs:
            self.file.unused(self.file)


@dataclass
class DiskStats:
    files: int = 0  # on disk or being written
    adopted: int = 0  # entries found at start-up and placed in the tree
    writes: int = 0
    write_bytes: int = 0
    write_s: float = 0.0  # the writer thread's time (write, fsync, rename)
    serialize_s: float = 0.0  # the engine thread's (arrays into bytes)
    loads: int = 0  # files read back for requests ("hits from disk")
    load_tokens: int = 0
    snapshot_loads: int = 0  # of those, with the snapshot of the non-trimmable layers
    read_s: float = 0.0  # the reader thread's time (read, checksum, parse)
    load_s: float = 0.0  # the engine thread's (bytes into MLX arrays)
    dropped: int = 0  # entries lost: corrupt, unreadable, or a failed write
    unwritten: int = 0  # nodes the memory tier evicted without a file: stored once, never reused
    evicted: int = 0  # files deleted to keep the disk budget (or no longer referred to)
    open_s: float = 0.0  # rebuilding the tree's keys from the files
    fingerprint_s: float = 0.0  # hashing the model (core/cache/disk/identity.py)
