"""The disk tier of the prefix cache: tree nodes whose K/V lives in files, read back on demand.

Owns: which node's K/V is in which file (`DiskFile`, `DiskRef`), writing entries (the
path of every inserted sequence, a bounded number of bytes per engine turn, and at once
when the memory tier evicts a node that has no copy yet: it is spilled, not dropped),
reading them back for a waiting request (`want`), rebuilding the tree's keys from the files
at start-up (`open`), the disk byte budget (least recently used leaves go first), and
dropping a file that fails its checksum with everything that hangs below it.

A file holds one node's own tokens (its K/V, `k{i}`/`v{i}` per plain K/V layer, exactly n
long), the snapshot of the other layers at its end if the node has one (their state's
arrays, its structure in the metadata, restored into the class this model's layer has,
never one a file names) and, in its metadata, the whole tree key up to its end: a restart places it under
the entries that hold its prefix, and one whose prefix is gone is an orphan and deleted.
Splitting a node needs no I/O: both halves refer to ranges of the same file. Files are
kept per model fingerprint (core/cache/identity.py) and sharing mode, so another model
never reads them. A user's private namespace stays theirs: tagged tokens are written with
the owner's name (not this process's namespace number) and retagged on restart through
the scope (core/cache/scope.py), in a folder only the server's user can open.

Left to others: the tree (radix.py), the MLX segments (kv.py), file I/O and checksums
(diskio.py, its two threads), the schedule (the engine calls `tick` once a turn and holds
a request back while `want` says its prefix is still on disk). Runs in the engine thread,
which alone turns arrays into bytes (`mx.save_safetensors` into memory) and back.
"""

from __future__ import annotations

import atexit
import io
import json
import logging
import queue
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import mlx.core as mx

from radixchat.core.cache.diskio import Corrupt, Job, Reader, Writer, make_private_dir, parse_name, read_header
from radixchat.core.cache.kv import KVSegment, PrefixStore, Snapshot
from radixchat.core.cache.radix import Node, RadixCache

log = logging.getLogger("radixchat.disk")
FORMAT = "1"
_SHIFT, _MASK = 32, (1 << 32) - 1  # core.cache.scope's tags: token + namespace << 32
# Engine-thread work per turn, so a running stream waits little longer than one step.
# Measured here on 11.8 MB (256 tokens of SmolLM2): into safetensors bytes 2.3 ms, numpy
# views into MLX arrays 1.4 ms; reading and checking the file is the reader thread's.
WRITE_BYTES_PER_TURN = 32 << 20
READ_BYTES_PER_TURN = 64 << 20
MAX_BACKLOG = 256 << 20  # bytes waiting for the writer; past it, entries wait in memory


class DiskFile:
    """One file (or one being written): which nodes refer to which of its tokens."""

    __slots__ = ("data", "dig", "n", "nbytes", "path", "refs", "seq", "snap", "state", "tier")

    def __init__(self, tier: DiskTier, seq: int, nbytes: int, n: int, state: str):
        self.tier, self.seq, self.nbytes, self.n, self.state = tier, seq, nbytes, n, state
        self.path: Path | None = None
        self.dig = ""
        self.refs: set[DiskRef] = set()
        self.data: bytes | None = None  # its bytes until the writer has written them
        self.snap = False  # holds the snapshot of the non-trimmable layers at its end

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
            self.file.tier._unused(self.file)


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
    evicted: int = 0  # files deleted to keep the disk budget (or no longer referred to)
    open_s: float = 0.0  # rebuilding the tree's keys from the files
    fingerprint_s: float = 0.0  # hashing the model (core/cache/identity.py)


class DiskTier:
    def __init__(
        self, folder: Path, budget: int, fingerprint: str, sharing: str, store: PrefixStore, wake: Callable[[], None]
    ):
        make_private_dir(folder)
        self.folder, self.budget, self.fp, self.sharing = folder, budget, fingerprint, sharing
        self.trimmable, self.classes = store.trimmable, store.classes
        self.tree: RadixCache | None = None
        self.seq = 0
        self.bytes = 0  # of files on disk or being written
        self.backlog = 0  # bytes handed to the writer, not written yet
        self.deleting = 0  # deletes handed to the writer, not done yet
        self.todo: deque[Node] = deque()  # ends of inserted sequences, to write their paths
        self.loading: set[DiskFile] = set()
        self.owners: dict[int, str] = {}  # namespace tag (this process's) -> owner name
        self.stats = DiskStats()
        self._done: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._io_event = event = threading.Event()
        self._wake = wake

        def io_done():  # the threads hold this, never the tier (nor, through it, the tree)
            event.set()
            wake()

        self.writer = Writer(folder, self._done, io_done)
        self.reader = Reader(self._done, io_done)
        # a clean stop lets the writer finish what it was given
        atexit.register(self.writer.close, 10.0)

    # ---- start-up ----------------------------------------------------------------------

    def open(self, tree: RadixCache, tag_of: Callable[[str], int]) -> None:
        """Rebuild `tree`'s keys from the files (K/V stays on disk until a hit). `tag_of`
        gives an owner's namespace tag in this process (see core.cache.scope)."""
        t0 = time.perf_counter()
        self.tree = tree
        tree.spill = self._spill
        self._prune_other_models()
        entries = []
        for p in self.folder.iterdir():
            if p.name.endswith(".tmp"):  # a write that never finished (killed): never visible
                p.unlink(missing_ok=True)
                continue
            parsed = parse_name(p.name)
            if parsed is None:
                continue
            try:
                meta = read_header(p).get("__metadata__") or {}
                if (meta.get("format"), meta.get("fingerprint"), meta.get("sharing")) != (
                    FORMAT,
                    self.fp,
                    self.sharing,
                ):  # written under another --cache-sharing
                    log.info("disk cache: %s was written under other settings: deleted", p.name)
                    p.unlink(missing_ok=True)
                    continue
                key, start = self._key_of(meta, tag_of)
                size = p.stat().st_size
            except (Corrupt, OSError, ValueError, KeyError, TypeError) as e:
                log.warning("disk cache: dropping unreadable %s (%s)", p.name, e)
                self.stats.dropped += 1
                p.unlink(missing_ok=True)
                continue
            entries.append((start, parsed[0], parsed[1], key, p, size, "snapshot" in meta))
            self.seq = max(self.seq, parsed[0] + 1)
        for start, seq, dig, key, p, size, snap in sorted(entries, key=lambda e: e[:2]):
            f = DiskFile(self, seq, size, len(key) - start, "ready")
            f.path, f.dig, f.snap = p, dig, snap
            self.bytes += size
            self.stats.files += 1
            if tree.adopt(key, start, lambda s, e: f.ref(s - start, e - s)):  # noqa: B023
                self.stats.adopted += 1
            else:  # an orphan (its prefix is gone) or a duplicate
                self._unused(f)
        self._fit()
        self.stats.open_s = time.perf_counter() - t0
        log.info(
            "disk cache %s: %d entries, %.1f MB, %d tokens",
            self.folder,
            self.stats.adopted,
            self.bytes / 1e6,
            tree.disk_tokens,
        )

    def _key_of(self, meta: dict, tag_of: Callable[[str], int]) -> tuple[list[int], int]:
        key, start = json.loads(meta["key"]), int(meta["start"])
        if not (0 <= start < len(key)) or int(meta["n"]) != len(key) - start:
            raise ValueError("inconsistent key")
        if any(t >> _SHIFT for t in key):
            tag = tag_of(meta["owner"])
            key = [(t & _MASK) | tag if t >> _SHIFT else t for t in key]
        return key, start

    def _prune_other_models(self) -> None:
        """Folders of other fingerprints count against the budget: oldest go first. Only
        folders that are plainly this tier's (a fingerprint's name, nothing but its files)."""

        def ours(p: Path) -> bool:
            return (
                p.is_dir()
                and p != self.folder
                and len(p.name) == len(self.folder.name)
                and all(c in "0123456789abcdef" for c in p.name)
                and all(f.is_file() and (parse_name(f.name) or f.name.endswith(".tmp")) for f in p.iterdir())
            )

        others = [p for p in self.folder.parent.iterdir() if ours(p)]
        sizes = {p: sum(f.stat().st_size for f in p.iterdir() if f.is_file()) for p in others}
        mine = sum(f.stat().st_size for f in self.folder.iterdir() if f.is_file())
        total = mine + sum(sizes.values())
        for p in sorted(others, key=lambda p: p.stat().st_mtime):
            if total <= self.budget:
                break
            shutil.rmtree(p, ignore_errors=True)
            total -= sizes[p]

    # ---- the engine's turn -------------------------------------------------------------

    def note_owner(self, tag: int, owner: str | None) -> None:
        self.owners[tag >> _SHIFT] = owner or ""

    def persist(self, node: Node) -> None:
        """`node` ends a sequence just inserted: write what of its path has no file yet
        (in the engine's next turn, which the wake-up brings even to an idle engine)."""
        self.todo.append(node)
        if len(self.todo) == 1:
            self._wake()

    def tick(self) -> bool:
        """One engine turn's disk work; True when more is ready to do at once."""
        converted = self._drain()
        budget = WRITE_BYTES_PER_TURN
        while self.todo and budget > 0 and self.backlog < MAX_BACKLOG:
            budget -= self._write_path(self.todo[0])
            self.todo.popleft()  # only now: `summary` (other threads) never sees it in neither
        self._fit()
        return (bool(self.todo) and self.backlog < MAX_BACKLOG) or (
            converted >= READ_BYTES_PER_TURN and not self._done.empty()
        )

    def want(self, path: list[Node]) -> bool:
        """Are all of `path`'s nodes in memory? If not, ask the reader for their files."""
        ready = True
        for node in path:
            if node.spilled:
                ready = False
                f = node.disk.file
                if f not in self.loading and f.state in ("pending", "ready"):
                    self.loading.add(f)
                    self.reader.put(Job("read", f, path=f.path, data=f.data, dig=f.dig))
        return ready

    def wait_io(self, timeout: float) -> None:
        """Sleep until a read or write is done (or `timeout`): an idle engine waiting for
        the disk blocks here instead of spinning."""
        if self.loading:
            self._io_event.wait(timeout)
        self._io_event.clear()

    def summary(self) -> dict:
        out = asdict(self.stats)
        out.update(
            bytes=self.bytes,
            budget=self.budget,
            folder=str(self.folder),
            backlog_bytes=self.backlog,
            deleting=self.deleting,
            waiting=len(self.todo),
            reading=len(self.loading),
        )
        return out

    def close(self, timeout: float = 10.0) -> None:
        """Let the writer finish what it was given (a clean stop keeps those entries)."""
        self.writer.close(timeout)
        self.reader.close(1.0)

    # ---- writing -----------------------------------------------------------------------

    def _spill(self, node: Node) -> None:
        """The memory tier evicts `node`, which has no file yet: write it now."""
        prefix = self._prefix_of(node)
        if prefix is not None:
            self._write(node, prefix)

    def _write_path(self, end: Node) -> int:
        path, n = [], end
        while n.parent is not None:
            if n.parent.children.get(n.key[0]) is not n:
                return 0  # evicted since: nothing to write
            path.append(n)
            n = n.parent
        cost, prefix = 0, []
        for n in reversed(path):
            if n.disk is None and n.seg is not None:
                cost += self._write(n, prefix)
            prefix += n.key
        return cost

    @staticmethod
    def _prefix_of(node: Node) -> list[int] | None:
        parts, n = [], node.parent
        while n is not None and n.parent is not None:
            if n.parent.children.get(n.key[0]) is not n:
                return None
            parts.append(n.key)
            n = n.parent
        return [t for part in reversed(parts) for t in part]

    def _write(self, node: Node, prefix: list[int]) -> int:
        key = prefix + list(node.key)
        owner = self._owner_of(key)
        if owner is None:
            return 0
        t0 = time.perf_counter()
        arrays = {}
        for i, kv in enumerate(node.seg.layers):
            if kv is not None:
                arrays[f"k{i}"], arrays[f"v{i}"] = kv
        meta = {
            "format": FORMAT,
            "fingerprint": self.fp,
            "sharing": self.sharing,
            "start": str(len(prefix)),
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
        data = buf.getvalue()
        self.stats.serialize_s += time.perf_counter() - t0
        if len(data) > self.budget:
            return 0
        # make room first: the deletes are queued ahead of this write, so the folder never
        # holds more than the budget, even for a moment
        self.tree.fit_disk(lambda: self.bytes + len(data) > self.budget)
        f = DiskFile(self, self.seq, len(data), len(node.key), "pending")
        self.seq += 1
        f.data, f.snap = data, node.snapshot is not None
        self.tree.set_disk(node, f.ref(0, len(node.key)))
        self.bytes += len(data)
        self.backlog += len(data)
        self.stats.files += 1
        self.writer.put(Job("write", f, data=data, extra={"seq": f.seq}))
        return len(data)

    def _owner_of(self, key: list[int]):
        """True for an untagged key, the owner's name for a tagged one, None if unknown."""
        tags = {t >> _SHIFT for t in key if t >> _SHIFT}
        if not tags:
            return True
        if len(tags) > 1:
            return None
        return self.owners.get(tags.pop())

    # ---- results, reading back, losing -------------------------------------------------

    def _drain(self) -> int:
        converted = 0
        while converted < READ_BYTES_PER_TURN:
            try:
                job = self._done.get_nowait()
            except queue.Empty:
                break
            f = job.entry
            if job.kind == "write":
                self.backlog -= f.nbytes
                self.stats.write_s += job.seconds
                if job.error:
                    log.warning("disk cache: write failed: %s", job.error)
                    self._lose(f)
                    continue
                f.data = None
                f.path, f.dig = job.path, parse_name(job.path.name)[1]
                self.stats.writes += 1
                self.stats.write_bytes += f.nbytes
                if f.state == "pending":
                    f.state = "ready"
            elif job.kind == "delete":
                self.deleting -= 1
            elif job.kind == "read":
                self.loading.discard(f)
                self.stats.read_s += job.seconds
                if f.state == "gone":
                    continue
                if job.error:
                    log.warning("disk cache: dropping %s: %s", f.path and f.path.name, job.error)
                    self._lose(f)
                    continue
                converted += self._load(f, job.result)
        return converted

    def _load(self, f: DiskFile, result) -> int:
        t0 = time.perf_counter()
        arrays, meta, bf16 = result
        try:
            if meta.get("fingerprint") != self.fp or int(meta.get("n", -1)) != f.n:
                raise Corrupt("another model's entry")
            mxa = {name: mx.array(a).view(mx.bfloat16) if name in bf16 else mx.array(a) for name, a in arrays.items()}
            kv = {}
            for i, t in enumerate(self.trimmable):
                if t:
                    k, v = mxa[f"k{i}"], mxa[f"v{i}"]
                    if k.ndim != 4 or k.shape[2] != f.n or v.shape != k.shape:
                        raise Corrupt(f"layer {i} holds {k.shape}, not {f.n} tokens")
                    kv[i] = (k, v)
            snapshot = self._snapshot_of(meta, mxa) if f.snap else None
        except (Corrupt, KeyError, ValueError, TypeError) as e:
            log.warning("disk cache: dropping %s: %s", f.path and f.path.name, e)
            self._lose(f)
            return 0
        tokens, fresh = 0, []
        for ref in list(f.refs):
            if not ref.node.spilled:
                continue
            whole = ref.start == 0 and ref.n == f.n
            layers = [
                None
                if i not in kv
                else kv[i]
                if whole
                else tuple(mx.contiguous(a[..., ref.start : ref.start + ref.n, :]) for a in kv[i])
                for i in range(len(self.trimmable))
            ]
            # the physical trim across tiers: exactly this node's tokens come back
            assert all(pair[0].shape[2] == pair[1].shape[2] == ref.n for pair in layers if pair)
            fresh += [a for pair in layers if pair for a in pair]
            self.tree.attach(ref.node, KVSegment(layers, ref.n), snapshot if ref.snap else None)
            tokens += ref.n
        mx.async_eval(fresh)
        self.tree.fit()
        self.stats.loads += 1
        self.stats.snapshot_loads += snapshot is not None
        self.stats.load_tokens += tokens
        self.stats.load_s += time.perf_counter() - t0
        return f.nbytes

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

    def _lose(self, f: DiskFile) -> None:
        """A file that cannot be served: nodes that had only it leave the tree (with what
        hangs below them), nodes in memory keep their K/V without a copy."""
        if f.state == "gone":
            return
        self.stats.dropped += 1
        f.state = "lost"
        for ref in list(f.refs):
            node = ref.node
            if node.spilled:
                self.tree.drop(node)
            else:
                self.tree.set_disk(node, None)
        if f.refs:  # nodes no longer in the tree still held it
            f.refs.clear()
            self._unused(f)

    def _unused(self, f: DiskFile) -> None:
        """Nothing refers to `f` any more: delete it (after its write, if one is queued)."""
        if f.state == "gone":
            return
        f.state = "gone"
        f.data = None
        self.bytes -= f.nbytes
        self.stats.files -= 1
        self.stats.evicted += 1
        self.deleting += 1
        self.writer.put(Job("delete", f, path=f.path, extra={"seq": f.seq}))

    def _fit(self) -> None:
        if self.bytes > self.budget:
            self.tree.fit_disk(lambda: self.bytes > self.budget)


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


def cache_folder(settings) -> Path:
    """The disk tier's root: --cache-dir, else `kv-cache` beside the SQLite file (the
    server's data folder, core.config.default_data_dir unless --db moved it)."""
    return Path(settings.cache_dir).expanduser() if settings.cache_dir else settings.db.parent / "kv-cache"


def open_tier(settings, loaded, prefix, scope, wake: Callable[[], None]) -> DiskTier | None:
    """The disk tier for this model (its own folder under `cache_folder`), with the tree's
    keys rebuilt from it; None where it cannot be kept (a hub id: no files to fingerprint)."""
    from radixchat.core.cache.identity import fingerprint
    from radixchat.core.engine.catalog import resolve

    model_dir = Path(loaded.gguf.folder) if loaded.gguf is not None else Path(resolve(settings.model).path).expanduser()
    if not model_dir.is_dir():
        log.warning("disk cache: %s is not a local folder to fingerprint; memory tier only", model_dir)
        return None
    t0 = time.perf_counter()
    fp = fingerprint(
        model_dir,
        {
            "format": FORMAT,
            "dtype": loaded.dtype,
            "runs_as": loaded.runs_as,
            "context_length": loaded.context_length,
            "layers": [c.__name__ for c in prefix.classes],
        },
    )
    root = cache_folder(settings)
    make_private_dir(root, ours=settings.cache_dir is None)
    tier = DiskTier(root / fp[:32], settings.cache_disk_bytes, fp, settings.cache_sharing, prefix, wake)
    tier.stats.fingerprint_s = time.perf_counter() - t0
    tier.open(prefix.tree, lambda owner: scope.key([0], 0, owner or None)[0] & ~_MASK)
    prefix.disk = tier
    return tier


def disk_usage(settings) -> tuple[int, int]:
    """(bytes, files) under the disk tier's root, for `doctor` (no model needed)."""
    root = cache_folder(settings)
    total = files = 0
    if root.is_dir():
        for p in root.rglob("*.safetensors"):
            try:
                total += p.stat().st_size
                files += 1
            except OSError:
                pass
    return total, files
