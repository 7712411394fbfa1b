"""The disk tier's files and its two I/O threads; no MLX.

One file per cache entry, in safetensors format (written by the engine thread with
`mx.save_safetensors` into bytes; its header is JSON and its metadata says what the entry
is). A file becomes visible under its final name only complete and synced: written to a
temporary name opened 0600, fsync, rename, fsync of the folder. Its name carries the
sha256 of all its bytes, `<seq>.<digest>.safetensors`, so a torn or flipped file is caught
when read and is never served (`Corrupt`).

`Writer` writes and deletes files, `Reader` reads and checks them; each is one daemon
thread fed by a queue, and both hand results to one queue the engine thread drains, then
call `wake` so an idle engine thread comes to drain it. Neither touches MLX: the writer
gets bytes the engine thread already made, the reader returns numpy views that the engine
thread turns into MLX arrays. A write the disk refuses for want of space (ENOSPC, EDQUOT)
sets `FullDisk`: the writer then skips the writes it holds without trying them, until the
engine thread, which alone clears it (core/cache/disk/budget.py), finds room again. sha256
rather than blake2b: with SHA extensions it hashed
11.8 MB in 11.5 ms here against 21.7 ms.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import queue
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("radixchat.disk")
SUFFIX = ".safetensors"
DIGEST_CHARS = 32  # of sha256's hex: 128 bits are plenty against accidents
_DTYPES = {
    "F32": np.float32,
    "F16": np.float16,
    "BF16": np.uint16,
    "F64": np.float64,
    "I32": np.int32,
    "I64": np.int64,
    "U32": np.uint32,
    "U8": np.uint8,
    "I8": np.int8,  # --kv-bits 8's codes (core.cache.kv_format)
    "BOOL": np.bool_,
}


# a disk that has no room for a write, for everyone or for this user (quota)
FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


class Corrupt(Exception):
    """A file whose bytes do not match its name's digest, or that does not parse."""


def digest(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()[:DIGEST_CHARS]


def file_name(seq: int, dig: str) -> str:
    return f"{seq:012x}.{dig}{SUFFIX}"


def parse_name(name: str) -> tuple[int, str] | None:
    """(seq, digest) of a finished file's name, None for anything else."""
    if not name.endswith(SUFFIX):
        return None
    parts = name[: -len(SUFFIX)].split(".")
    if len(parts) != 2 or len(parts[1]) != DIGEST_CHARS:
        return None
    try:
        return int(parts[0], 16), parts[1]
    except ValueError:
        return None


def make_private_dir(path: Path, ours: bool = True) -> None:
    """Create `path` for the server's user only (0700, whatever the umask). A folder that
    already exists keeps its mode unless it is `ours` (a folder someone named with
    --cache-dir, say /tmp, is never changed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        if not ours:
            return
    os.chmod(path, 0o700)


def read_header(path: Path) -> dict:
    """The safetensors header of a file (its tensors and `__metadata__`), reading only it."""
    with open(path, "rb") as f:
        return _header(f.read(8), f.read)


def _header(first8: bytes, read: Callable[[int], bytes]) -> dict:
    if len(first8) != 8:
        raise Corrupt("short file")
    (n,) = struct.unpack("<Q", first8)
    if n > 64 << 20:
        raise Corrupt("header too long")
    raw = read(n)
    if len(raw) != n:
        raise Corrupt("short header")
    try:
        return json.loads(raw)
    except ValueError as e:
        raise Corrupt(f"header: {e}") from None


def arrays_of(data: bytes) -> tuple[dict[str, np.ndarray], dict, set[str]]:
    """Numpy views of a file's tensors (no copy), its metadata and the bfloat16 names
    (read as uint16: numpy has no bfloat16; the engine thread views them back)."""
    header = _header(data[:8], lambda n: data[8 : 8 + n])
    base = 8 + struct.unpack("<Q", data[:8])[0]
    meta = header.pop("__metadata__", {}) or {}
    out, bf16 = {}, set()
    for name, t in header.items():
        dtype = _DTYPES.get(t.get("dtype"))
        if dtype is None:
            raise Corrupt(f"dtype {t.get('dtype')}")
        b, e = t["data_offsets"]
        a = np.frombuffer(data, dtype=dtype, count=(e - b) // np.dtype(dtype).itemsize, offset=base + b)
        out[name] = a.reshape(t["shape"])
        if t["dtype"] == "BF16":
            bf16.add(name)
    return out, meta, bf16


def write_file(folder: Path, seq: int, data: bytes) -> Path:
    """Write `data` as a finished file of `folder`, visible only once complete and synced."""
    tmp = folder / f".{seq:012x}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        final = folder / file_name(seq, digest(data))
        os.replace(tmp, final)
    except BaseException:  # a full disk, say: leave nothing behind (a kill leaves the .tmp)
        tmp.unlink(missing_ok=True)
        raise
    dfd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dfd)  # the rename itself survives a crash
    finally:
        os.close(dfd)
    return final


def read_file(path: Path, dig: str) -> bytes:
    data = path.read_bytes()
    if digest(data) != dig:
        raise Corrupt("checksum mismatch")
    return data


@dataclass
class Job:
    """One unit of work for a thread; `result` and `error` are filled in there."""

    kind: str  # "write", "delete", "read"
    entry: Any  # the engine thread's DiskFile (never touched by the thread)
    path: Path | None = None
    data: bytes | None = None
    dig: str = ""
    result: Any = None
    error: str = ""
    errno: int = 0  # of the OSError that ended it, 0 for none or another exception
    skipped: bool = False  # a write not tried: the disk was full (FullDisk)
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)


class FullDisk:
    """The disk refused a write for want of space: set by the writer thread at once, so that
    it skips the writes already queued; cleared by the engine thread when a reading of the
    free space finds room (core/cache/disk/budget.py). `since`: when it was set (monotonic)."""

    def __init__(self):
        self._set = threading.Event()
        self.since = 0.0

    def set(self) -> None:
        self.since = time.monotonic()
        self._set.set()

    def clear(self) -> None:
        self._set.clear()

    def is_set(self) -> bool:
        return self._set.is_set()


class _Worker:
    def __init__(self, name: str, done: queue.SimpleQueue, wake: Callable[[], None]):
        self.jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.done, self.wake = done, wake
        self.busy = 0  # jobs put and not yet done (read by the engine thread, roughly)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, job: Job) -> None:
        self.busy += 1
        self.jobs.put(job)

    def close(self, timeout: float) -> None:
        self.jobs.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            t0 = time.perf_counter()
            try:
                self.handle(job)
            except Exception as e:  # an I/O error ends that job only
                job.error = f"{type(e).__name__}: {e}"
                job.errno = getattr(e, "errno", None) or 0
            job.seconds = time.perf_counter() - t0
            self.busy -= 1
            self.done.put(job)
            self.wake()

    def handle(self, job: Job) -> None:
        raise NotImplementedError


class Writer(_Worker):
    """Writes files (`data` -> a finished file named by its digest) and deletes them, in
    the order asked: a delete queued after a write runs after it. `on_disk` counts the
    bytes of the folder's finished files as this thread leaves them (it alone changes the
    folder once the tier is open), which the tier's limit adds to the free space it reads
    (core/cache/disk/budget.py). While `full` is set, writes are skipped, never tried."""

    def __init__(self, folder: Path, done: queue.SimpleQueue, wake: Callable[[], None], full: FullDisk):
        self.folder, self.full = folder, full
        self.on_disk = 0  # set by the engine thread at start-up, before any job
        super().__init__("radixchat-disk-writer", done, wake)

    def handle(self, job: Job) -> None:
        if job.kind == "write":
            data, job.data = job.data, None
            if self.full.is_set():  # each try would fail as the last did, and cost a create and unlink
                job.error, job.errno, job.skipped = "the disk is full", errno.ENOSPC, True
                return
            try:
                job.path = write_file(self.folder, job.extra["seq"], data)
            except OSError as e:
                if e.errno in FULL:
                    self.full.set()
                raise
            self.on_disk += len(data)
        elif job.kind == "delete":  # a file still being written had no name yet: find it
            path = job.path or next(self.folder.glob(f"{job.extra['seq']:012x}.*{SUFFIX}"), None)
            if path is not None:
                try:
                    size = path.stat().st_size
                except FileNotFoundError:
                    return
                # counted out before it goes, as a write is counted in after: a reading
                # between the two may find less room than there is, never more
                self.on_disk -= size
                path.unlink(missing_ok=True)


class Reader(_Worker):
    """Reads a file, checks its digest and parses it into numpy views (`result`: arrays,
    metadata, bfloat16 names). An entry still being written is read from its bytes."""

    def __init__(self, done: queue.SimpleQueue, wake: Callable[[], None]):
        super().__init__("radixchat-disk-reader", done, wake)

    def handle(self, job: Job) -> None:
        data = job.data if job.data is not None else read_file(job.path, job.dig)
        job.data = None
        try:
            job.result = arrays_of(data)
        except (KeyError, ValueError, TypeError, struct.error) as e:
            raise Corrupt(f"unreadable: {e}") from None
