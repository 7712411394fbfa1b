"""The disk tier's room: how many bytes its files may hold now, and how many of them one owner's.

Owns the limit and the decision before every write. The limit (`DiskRoom.limit`) follows
the filesystem the cache folder is on: `--cache-disk-bytes auto` (serve's default) allows a
quarter of what the tier could have (its own bytes plus the free bytes), a number allows
that many bytes, and neither ever takes the disk below a reserve of a tenth of its size
(at least 1 GiB), so when another program fills the disk the tier shrinks. The free space
is re-read every EVERY_S seconds by a thread of its own (statvfs can block on a network
filesystem: never in the engine thread), which wakes the engine when the limit shrank.
Before a write (`make_room`): an entry larger than the limit, or than its owner's share,
is refused; an owner over their share loses their own least recently used entries first;
then the least recently used entries of everyone go until the write fits; and if it still
does not (the rest is locked by running requests, or held by what hangs below it), it is
refused. So the folder never holds more than the limit in force when its last write was
queued, not even while a file is being written: deletes are queued to the writer ahead of
the write they make room for (core/cache/disk/fileio.py runs them in order).

A user's share: one owner's private entries (core/cache/scope.py tags them; a file is
charged to the owner its key names, shared system-message entries to nobody) hold at most
the limit divided by the number of owners with entries, between a half and a sixteenth of
it, so one user cannot fill the tier, nor, through it, the disk. --no-auth's one user and
the server's own warm-up prompts are not capped.

A full disk (a write refused with ENOSPC or EDQUOT, as when another program fills it between
two readings, or a quota the free space does not show): the writer stops trying at once
(core/cache/disk/fileio.py `FullDisk`), one warning says so, and every write after it is refused
(counted) before its entry is even made into bytes, until a reading of the free space taken
since finds room for the entry (so it is looked at again at most every EVERY_S); one line
says when the tier writes again. Any other failed write is logged once per errno until then
(or, with no full disk, once per errno every QUIET_S), never once per entry.

Left to others: the files, their bytes and the tier's counts (tier.py, files.py), the
tree's least-recently-used order and eviction (radix.py `fit_disk`), writing and deleting
(fileio.py), the folders (folder.py). Runs in the engine thread, but for the watcher
thread, which only reads the filesystem and the writer's count of the bytes it left on
disk (read on both sides of the filesystem's reading, the smaller taken, so a write or a
delete meanwhile never makes the disk look roomier) and holds the room only weakly, so it
ends with its tier.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

from radixchat.core.cache.disk.fileio import FULL, FullDisk
from radixchat.core.cache.warm import WARM_OWNER
from radixchat.core.config import DISK_AUTO

log = logging.getLogger("radixchat.disk")

AUTO_SHARE = 0.25  # auto: a quarter of (the tier's own bytes + the free bytes)
RESERVE_SHARE, RESERVE_MIN = 0.10, 1 << 30  # always left free: a tenth of the disk, at least 1 GiB
EVERY_S = 5.0  # how often the free space is read again
OWNERS_MIN, OWNERS_MAX = 2, 16  # one owner's share: limit / owners, between 1/2 and 1/16 of it
QUIET_S = 60.0  # a failed write's errno is logged again at most this often
UNCAPPED = ("", WARM_OWNER)  # --no-auth's one user, the server's warm-up prompts
statvfs = os.statvfs  # (tests put a filesystem of their own here)


def limit_for(setting: int, avail: int, size: int) -> int:
    """The tier's limit for `--cache-disk-bytes setting` on a filesystem of `size` bytes of
    which `avail` are free or the tier's own."""
    room = max(0, avail - max(int(size * RESERVE_SHARE), RESERVE_MIN))
    if setting == DISK_AUTO:
        return min(int(avail * AUTO_SHARE), room)
    return min(setting, room)


def limit_now(folder: Path, setting: int, on_disk: int) -> int | None:
    """The whole limit a tier in `folder` (which need not exist yet) holding `on_disk` bytes
    would have now; None when the free space cannot be read (for `doctor`)."""
    p = folder
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = statvfs(p)
    except OSError:
        return None
    return limit_for(setting, st.f_bavail * st.f_frsize + on_disk, st.f_blocks * st.f_frsize)


class DiskRoom:
    """The limit of one tier (all its folders: this model's and, as found at start-up,
    other models'), the bytes each owner's entries hold, and the choice before a write."""

    def __init__(
        self,
        folder: Path,
        setting: int,
        on_disk: Callable[[], int],
        wake: Callable[[], None],
        full: FullDisk | None = None,
    ):
        self.folder, self.setting = folder, setting
        self.full = full or FullDisk()  # the writer's, which sets it
        self.free = 0  # the filesystem's free bytes at the last reading
        self.read_at = 0.0  # when that was (monotonic)
        self._looked = 0.0  # the reading a full disk was last judged by
        self._told: dict[int, float] = {}  # errnos of failed writes logged -> when
        self._on_disk = on_disk  # this model's bytes in files now (any thread may ask)
        self.others = 0  # bytes of other models' folders that start-up kept
        self.limit = 0  # this model's folder may hold this many bytes (whole tier's less `others`)
        self.owner_bytes: dict[str, int] = {}  # capped owners with entries -> their bytes
        self.refused = 0  # writes refused: larger than the limit or a share, or no room
        self._warned = False
        self._stop = threading.Event()
        self._wake = wake

    def read(self, tier_on_disk: int | None = None) -> int:
        """Read the free space again and set `limit` (any thread); returns the whole tier's
        limit. `tier_on_disk`: the bytes of all the tier's folders, when not this model's
        files and `others` (at start-up, before they are known)."""
        before = self._on_disk()
        try:
            st = statvfs(self.folder)
            self.free, self.read_at = st.f_bavail * st.f_frsize, time.monotonic()
            # the smaller count of either side of the reading: a write or a delete between
            # them never makes the disk look roomier than it is
            used = min(before, self._on_disk()) + self.others if tier_on_disk is None else tier_on_disk
            whole = limit_for(self.setting, st.f_bavail * st.f_frsize + used, st.f_blocks * st.f_frsize)
        except OSError as e:  # free space unknown: a fixed budget stands, auto keeps nothing
            if not self._warned:
                log.warning("disk cache: cannot read the free space of %s (%s)", self.folder, e)
                self._warned = True
            whole = 0 if self.setting == DISK_AUTO else self.setting
        self.limit = max(0, whole - self.others)
        return whole

    def watch(self, every: float | None = None) -> None:
        """Read the free space every `every` seconds (EVERY_S) in a thread of its own,
        waking the engine when the limit shrank (its next turn evicts down to it)."""
        ref, stop, wake, every = weakref.ref(self), self._stop, self._wake, every or EVERY_S

        def run() -> None:
            while not stop.wait(every):
                room = ref()
                if room is None:  # its tier is gone
                    return
                before = room.limit
                try:
                    room.read()
                except Exception:  # keep the last limit, and keep watching
                    log.exception("disk cache: reading the free space failed")
                shrank = room.limit < before
                del room
                if shrank:
                    wake()

        threading.Thread(target=run, name="radixchat-disk-room", daemon=True).start()

    def close(self) -> None:
        self._stop.set()

    # ---- owners ------------------------------------------------------------------------

    def charge(self, owner: str | None, nbytes: int) -> None:
        """Count a file of `owner` (None: shared) in (+) or out (-)."""
        if owner is None or owner in UNCAPPED:
            return
        left = self.owner_bytes.get(owner, 0) + nbytes
        if left > 0:
            self.owner_bytes[owner] = left
        else:
            self.owner_bytes.pop(owner, None)

    def share(self, owner: str) -> int:
        """The most bytes `owner`'s entries may hold, counting `owner` among those with some."""
        n = len(self.owner_bytes) + (owner not in self.owner_bytes)
        return self.limit // min(max(n, OWNERS_MIN), OWNERS_MAX)

    # ---- deciding ----------------------------------------------------------------------

    def make_room(self, tree, size: int, owner: str | None, held: Callable[[], int]) -> bool:
        """Make room for a file of `size` bytes of `owner` (None: shared), evicting least
        recently used entries (`tree`: radix.RadixCache), its owner's first when they are
        over their share; False when it cannot fit (what went while trying stays gone;
        an entry larger than the limit or the share costs nothing). `held`: the tier's
        bytes, written or queued for the writer."""
        if size > self.limit or (self.full.is_set() and not self._room_again(size)):
            return self._refuse()
        if owner is not None and owner not in UNCAPPED:
            share = self.share(owner)
            if size > share:
                return self._refuse()
            if not self._fit_owner(tree, owner, share - size):
                return self._refuse()

        def over() -> bool:
            return held() + size > self.limit

        if over():
            tree.fit_disk(over)
        return not over() or self._refuse()

    def trim(self, tree) -> None:
        """Bring every owner down to their share (after the limit changed)."""
        for owner in list(self.owner_bytes):
            self._fit_owner(tree, owner, self.share(owner))

    def _fit_owner(self, tree, owner: str, most: int) -> bool:
        def over() -> bool:
            return self.owner_bytes.get(owner, 0) > most

        if over():
            tree.fit_disk(over, pick=lambda n: n.disk.file.owner == owner)
        return not over()

    # ---- a full disk -------------------------------------------------------------------

    def paused(self) -> bool:
        """Is the disk full, with no reading of its free space since it was last judged?
        Then the write is refused (counted) before its entry is made into bytes."""
        if not self.full.is_set() or self.read_at > max(self._looked, self.full.since):
            return False
        return self._refuse()

    def _room_again(self, size: int) -> bool:
        """With the disk full: does a reading since find room for `size` bytes? If so the
        writer may try again (the next refusal sets it full again, without a new warning)."""
        fresh = self.read_at > max(self._looked, self.full.since)
        self._looked = max(self._looked, self.read_at)
        if not fresh or self.free < size:
            return False
        self.full.clear()
        return True

    def write_failed(self, job) -> None:
        """A write the writer could not do (fileio.Job): logged once per errno until the
        tier writes again (QUIET_S at most for another error), never once per entry."""
        if job.skipped:  # not tried: the disk was full
            self._refuse()
            return
        if job.errno in self._told and (job.errno in FULL or time.monotonic() - self._told[job.errno] < QUIET_S):
            return
        self._told[job.errno] = time.monotonic()
        if job.errno in FULL:
            log.warning(
                "disk cache: %s; the disk tier pauses writes until there is room for them (looked at every %.0f s)",
                job.error,
                EVERY_S,
            )
        else:
            log.warning("disk cache: write failed: %s (told once while it lasts)", job.error)

    def wrote(self) -> None:
        """A write succeeded: after a full disk, say so once."""
        if self._told and not FULL.isdisjoint(self._told):
            log.info("disk cache: disk tier writing again in %s", self.folder)
            self._told.clear()

    def _refuse(self) -> bool:
        self.refused += 1
        return False
