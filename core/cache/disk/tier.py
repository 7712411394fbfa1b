"""The disk tier of the prefix cache: tree nodes whose K/V lives in files, read back on demand.

Owns: writing entries (of each inserted sequence's path, the nodes another request's
sequence has gone through too, a bounded number of bytes per engine turn, and at once when
the memory tier evicts such a node that has no copy yet: it is spilled, not dropped; a node
stored once and never reused is not written, and evicted it is dropped: what a flood of
distinct prompts stores costs no disk work, as SGLang's HiCache's default,
`write_through_selective`, writes only what was hit; `writes="all"` writes every node, as
before), reading them back for a waiting request (`want`), placing the files
a start finds in the tree (`open`: the tree's keys come back, K/V stays on disk until a
hit; one whose prefix is gone is an orphan and deleted, as is a removed user's), keeping
the bytes its files hold within the limit core/cache/disk/budget.py decides (least recently
used leaves go first, a user's own first when over their share; a write that would not fit
is refused), and dropping a file that fails its checksum with everything below it. A
forgotten owner's files go with their nodes (core/cache/forget.py: a file nothing refers to
any more is deleted). Files are kept per model fingerprint (core/cache/disk/identity.py) and
sharing mode, so another model never reads them; a user's private namespace stays theirs,
in a folder only the server's user can open.

Left to others: the tree (radix.py), the MLX segments (kv.py), which node is in which file
(files.py), what a file holds and turning arrays into its bytes and back
(file_format.py), the folders and what a start finds in them (folder.py), how many
bytes it may hold and what goes to make room (budget.py, its watcher thread), file
I/O and checksums (fileio.py, its two threads), the schedule (the engine calls `tick` once a turn
and holds a request back while `want` says its prefix is still on disk). Runs in the engine
thread, which alone turns arrays into bytes and back.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Literal

import mlx.core as mx

from radixchat.core.cache.disk.budget import DiskRoom
from radixchat.core.cache.disk.file_format import FORMAT, TAG_SHIFT, TOKEN_MASK, EntryFormat
from radixchat.core.cache.disk.fileio import Corrupt, FullDisk, Job, Reader, Writer, make_private_dir, parse_name
from radixchat.core.cache.disk.files import DiskFile, DiskRef, DiskStats
from radixchat.core.cache.disk.folder import cache_folder, disk_usage, prune_other_models, scan
from radixchat.core.cache.kv import KVSegment, PrefixStore
from radixchat.core.cache.radix import Node, RadixCache

__all__ = ["FORMAT", "DiskFile", "DiskRef", "DiskStats", "DiskTier", "cache_folder", "disk_usage", "open_tier"]

log = logging.getLogger("radixchat.disk")
# Engine-thread work per turn, so a running stream waits little longer than one step.
# Measured here on 11.8 MB (256 tokens of SmolLM2): into safetensors bytes 2.3 ms, numpy
# views into MLX arrays 1.4 ms; reading and checking the file is the reader thread's.
WRITE_BYTES_PER_TURN = 32 << 20
READ_BYTES_PER_TURN = 64 << 20
MAX_BACKLOG = 256 << 20  # bytes waiting for the writer; past it, entries wait in memory


class DiskTier:
    def __init__(
        self,
        folder: Path,
        budget: int,
        fingerprint: str,
        sharing: str,
        store: PrefixStore,
        wake: Callable[[], None],
        writes: Literal["reused", "all"] = "reused",
    ):
        """`budget`: --cache-disk-bytes (core.config.DISK_AUTO for auto); `writes`:
        --cache-disk-writes, "reused" (nodes another request went through) or "all"."""
        make_private_dir(folder)
        self.write_all = writes == "all"
        self.folder = folder
        self.format = EntryFormat(fingerprint, sharing, store.trimmable, store.classes, store.fmt is not None)
        self.tree: RadixCache | None = None
        self.seq = 0
        self.bytes = 0  # of files on disk or being written
        self.backlog = 0  # bytes handed to the writer, not written yet
        self.deleting = 0  # deletes handed to the writer, not done yet
        self.todo: deque[tuple[Node, bool]] = deque()  # ends of inserted sequences (and `keep`), to write their paths
        self.loading: set[DiskFile] = set()
        self.owners: dict[int, str] = {}  # namespace tag (this process's) -> owner name
        self.stats = DiskStats()
        self._done: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._io_event = event = threading.Event()
        self._wake = wake

        def io_done():  # the threads hold this, never the tier (nor, through it, the tree)
            event.set()
            wake()

        full = FullDisk()  # the writer sets it, the room clears it
        self.writer = Writer(folder, self._done, io_done, full)
        self.reader = Reader(self._done, io_done)
        self.room = DiskRoom(folder, budget, self._on_disk, wake, full)  # the limit, owners' shares, a full disk
        self._fitted = -1  # the limit owners were last brought under their share of
        # a clean stop lets the writer finish what it was given
        atexit.register(self.writer.close, 10.0)

    # ---- start-up ----------------------------------------------------------------------

    def open(self, tree: RadixCache, tag_of: Callable[[str], int | None]) -> None:
        """Rebuild `tree`'s keys from the files (K/V stays on disk until a hit). `tag_of`
        gives an owner's namespace tag in this process (see core.cache.scope), None for an
        owner whose files are deleted instead (a removed user's)."""
        t0 = time.perf_counter()
        self.tree = tree
        tree.attach_spill(self._spill)
        self.room.others = prune_other_models(self.folder, lambda total: self.room.read(total))
        found, dropped = scan(self.folder, self.format, tag_of)
        self.stats.dropped += dropped
        self.seq = max([self.seq, *(e.seq + 1 for e in found)])
        self.writer.on_disk = sum(e.size for e in found)  # no job queued yet: the writer is idle
        for e in sorted(found, key=lambda e: (e.start, e.seq)):
            f = DiskFile(self._unused, e.seq, e.size, len(e.key) - e.start, "ready")
            f.path, f.dig, f.snap, f.owner = e.path, e.dig, e.snap, e.owner
            self.bytes += e.size
            self.room.charge(e.owner, e.size)
            self.stats.files += 1
            if tree.adopt(e.key, e.start, lambda s, end: f.ref(s - e.start, end - s)):  # noqa: B023
                self.stats.adopted += 1
            else:  # an orphan (its prefix is gone) or a duplicate
                self._unused(f)
        self.room.read()
        self._fit()
        self.room.watch()
        self.stats.open_s = time.perf_counter() - t0
        log.info(
            "disk cache %s: %d entries, %.1f MB, %d tokens",
            self.folder,
            self.stats.adopted,
            self.bytes / 1e6,
            tree.disk_tokens,
        )

    # ---- the engine's turn -------------------------------------------------------------

    @property
    def budget(self) -> int:
        """The bytes its files may hold now (core/cache/disk/budget.py)."""
        return self.room.limit

    def note_owner(self, tag: int, owner: str | None) -> None:
        self.owners[tag >> TAG_SHIFT] = owner or ""

    def persist(self, node: Node, keep: bool = False) -> None:
        """`node` ends a sequence just inserted: write what of its path has no file yet and
        was reused (all of it with `keep`), in the engine's next turn, which the wake-up
        brings even to an idle engine."""
        self.todo.append((node, keep or self.write_all))
        if len(self.todo) == 1:
            self._wake()

    def tick(self, write: bool = True) -> bool:
        """One engine turn's disk work; True when more is ready to do at once. Without
        `write`, what waits to be written waits a turn (its bytes are the engine thread's
        work: a newcomer's first token should not wait for them); reads go on."""
        converted = self._drain()
        budget = WRITE_BYTES_PER_TURN if write else 0
        while self.todo and budget > 0 and self.backlog < MAX_BACKLOG:
            budget -= self._write_path(*self.todo[0])
            self.todo.popleft()  # only now: `summary` (other threads) never sees it in neither
        self._fit()
        return (write and bool(self.todo) and self.backlog < MAX_BACKLOG) or (
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
            refused=self.room.refused,
        )
        return out

    def close(self, timeout: float = 10.0) -> None:
        """Let the writer finish what it was given (a clean stop keeps those entries)."""
        self.room.close()
        self.writer.close(timeout)
        self.reader.close(1.0)

    # ---- writing -----------------------------------------------------------------------

    def _spill(self, node: Node) -> None:
        """The memory tier evicts `node`, which has no file yet: write it now, if it was
        reused (else it is dropped)."""
        if not (node.hits or self.write_all):
            self.stats.unwritten += 1
            return
        prefix = self._prefix_of(node)
        if prefix is not None:
            self._write(node, prefix)

    def _write_path(self, end: Node, keep: bool) -> int:
        path, n = [], end
        while n.parent is not None:
            if n.parent.children.get(n.key[0]) is not n:
                return 0  # evicted since: nothing to write
            path.append(n)
            n = n.parent
        cost, prefix = 0, []
        for n in reversed(path):
            if n.disk is None and n.seg is not None:
                # a node's hits are at most its parent's: the reused part is the top of the path
                wrote = self._write(n, prefix) if keep or n.hits else None
                if wrote is None:  # what follows would be an orphan on disk
                    break
                cost += wrote
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

    def _write(self, node: Node, prefix: list[int]) -> int | None:
        """Queue `node`'s file; its bytes, or None when it is not written (no room)."""
        key = prefix + list(node.key)
        owner = self._owner_of(key)
        if owner is None or self.room.paused():
            return None
        t0 = time.perf_counter()
        data = self.format.to_bytes(node, key, len(prefix), owner)
        self.stats.serialize_s += time.perf_counter() - t0
        whose = None if owner is True else owner
        # room first: the deletes are queued ahead of this write, so the folder never
        # holds more than the limit, even for a moment
        if not self.room.make_room(self.tree, len(data), whose, lambda: self.bytes):
            return None
        f = DiskFile(self._unused, self.seq, len(data), len(node.key), "pending")
        self.seq += 1
        f.data, f.snap, f.owner = data, node.snapshot is not None, whose
        self.tree.set_disk(node, f.ref(0, len(node.key)))
        self.bytes += len(data)
        self.room.charge(whose, len(data))
        self.backlog += len(data)
        self.stats.files += 1
        self.writer.put(Job("write", f, data=data, extra={"seq": f.seq}))
        return len(data)

    def _owner_of(self, key: list[int]) -> str | bool | None:
        """True for an untagged key, the owner's name for a tagged one, None if unknown."""
        tags = {t >> TAG_SHIFT for t in key if t >> TAG_SHIFT}
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
                    self.room.write_failed(job)
                    self._lose(f)
                    continue
                self.room.wrote()
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
        try:
            kv, snapshot = self.format.layers(result, f.n, f.snap)
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
                for i in range(len(self.format.trimmable))
            ]
            # the physical trim across tiers: exactly this node's tokens come back
            assert all(a.shape[2] == ref.n for parts in layers if parts for a in parts)
            fresh += [a for parts in layers if parts for a in parts]
            self.tree.attach(ref.node, KVSegment(layers, ref.n), snapshot if ref.snap else None)
            tokens += ref.n
        mx.async_eval(fresh)
        self.tree.fit()
        self.stats.loads += 1
        self.stats.snapshot_loads += snapshot is not None
        self.stats.load_tokens += tokens
        self.stats.load_s += time.perf_counter() - t0
        return f.nbytes

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
        self.room.charge(f.owner, -f.nbytes)
        self.stats.files -= 1
        self.stats.evicted += 1
        self.deleting += 1
        self.writer.put(Job("delete", f, path=f.path, extra={"seq": f.seq}))

    def _fit(self) -> None:
        """Within the limit again (it shrinks when the disk fills), owners within their share."""
        room = self.room
        if self.bytes > room.limit:
            self.tree.fit_disk(lambda: self.bytes > room.limit)
        if room.limit != self._fitted:
            self._fitted = room.limit
            room.trim(self.tree)

    def _on_disk(self) -> int:
        """This model's bytes in files now, as the writer left them (any thread: the room's
        watcher asks): queued writes are not there yet, queued deletes still are."""
        return self.writer.on_disk


def open_tier(
    settings, loaded, prefix, scope, wake: Callable[[], None], adopts: Callable[[str], bool] = lambda owner: True
) -> DiskTier | None:
    """The disk tier for this model (its own folder under `cache_folder`), with the tree's
    keys rebuilt from it; None where it cannot be kept (a hub id: no files to fingerprint).
    A file of an owner `adopts` refuses (a removed user's) is deleted, never placed."""
    from radixchat.core.cache.disk.identity import fingerprint
    from radixchat.core.models.catalog import resolve

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
            "kv_format": prefix.fmt.name if prefix.fmt is not None else None,  # never read at another precision
        },
    )
    root = cache_folder(settings)
    make_private_dir(root, ours=settings.cache_dir is None)
    tier = DiskTier(
        root / fp[:32],
        settings.cache_disk_bytes,
        fp,
        settings.cache_sharing,
        prefix,
        wake,
        settings.cache_disk_writes,
    )
    tier.stats.fingerprint_s = time.perf_counter() - t0
    tier.open(prefix.tree, lambda owner: scope.tag(owner or None) & ~TOKEN_MASK if adopts(owner) else None)
    prefix.attach_disk(tier)
    return tier
