"""The disk tier's folders: where they are, and what a start finds in them.

Owns: the root (`cache_folder`: --cache-dir, else beside the SQLite file), one folder per
model fingerprint under it, the files a start finds in this model's folder (`scan`: their
keys, sizes, snapshots and owners; a write a kill cut short, a file of other settings, a
removed user's and one that does not parse are deleted there), pruning other models' folders
to the tier's limit (core/cache/disk/budget.py says it), and the usage `doctor` prints.
Left to others: placing what `scan` found in the tree and deleting what nothing refers to
(tier.py), what a file holds (file_format.py), names and checksums (fileio.py). Runs in
the engine thread when the tier opens; `disk_usage` in the CLI's.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from radixchat.core.cache.disk.file_format import EntryFormat, key_of
from radixchat.core.cache.disk.fileio import Corrupt, parse_name, read_header

log = logging.getLogger("radixchat.disk")


class Found(NamedTuple):
    """A file a start found, to be placed in the tree."""

    start: int  # where its own tokens start in `key`
    seq: int
    dig: str
    key: list[int]  # the tree key up to its end, in this process's tags
    path: Path
    size: int
    snap: bool  # holds a snapshot at its end
    owner: str | None  # the owner its tagged tokens belong to; None: shared (untagged)


def cache_folder(settings) -> Path:
    """The disk tier's root: --cache-dir, else `kv-cache` beside the SQLite file (the
    server's data folder, core.config.default_data_dir unless --db moved it)."""
    return Path(settings.cache_dir).expanduser() if settings.cache_dir else settings.db.parent / "kv-cache"


def scan(folder: Path, fmt: EntryFormat, tag_of: Callable[[str], int | None]) -> tuple[list[Found], int]:
    """The files of `folder` written under `fmt`, and how many unreadable ones were dropped.
    `tag_of` gives an owner's namespace tag in this process (see core.cache.scope), or None
    for an owner nobody may read again (a removed user): their files are deleted."""
    found, dropped = [], 0
    for p in folder.iterdir():
        if p.name.endswith(".tmp"):  # a write that never finished (killed): never visible
            p.unlink(missing_ok=True)
            continue
        parsed = parse_name(p.name)
        if parsed is None:
            continue
        try:
            meta = read_header(p).get("__metadata__") or {}
            if not fmt.matches(meta):  # written under another --cache-sharing
                log.info("disk cache: %s was written under other settings: deleted", p.name)
                p.unlink(missing_ok=True)
                continue
            if "owner" in meta and tag_of(meta["owner"]) is None:
                log.info("disk cache: %s belongs to a user no longer served: deleted", p.name)
                p.unlink(missing_ok=True)
                continue
            key, start = key_of(meta, tag_of)
            size = p.stat().st_size
        except (Corrupt, OSError, ValueError, KeyError, TypeError) as e:
            log.warning("disk cache: dropping unreadable %s (%s)", p.name, e)
            dropped += 1
            p.unlink(missing_ok=True)
            continue
        found.append(Found(start, parsed[0], parsed[1], key, p, size, "snapshot" in meta, meta.get("owner")))
    return found, dropped


def prune_other_models(folder: Path, limit_of: Callable[[int], int]) -> int:
    """Folders of other fingerprints beside `folder` count against the tier's limit, which
    `limit_of(bytes of every folder of the tier)` says: oldest go first. Only folders that
    are plainly this tier's (a fingerprint's name, nothing but its files). Returns the bytes
    the other folders still hold."""

    def ours(p: Path) -> bool:
        return (
            p.is_dir()
            and p != folder
            and len(p.name) == len(folder.name)
            and all(c in "0123456789abcdef" for c in p.name)
            and all(f.is_file() and (parse_name(f.name) or f.name.endswith(".tmp")) for f in p.iterdir())
        )

    others = [p for p in folder.parent.iterdir() if ours(p)]
    sizes = {p: sum(f.stat().st_size for f in p.iterdir() if f.is_file()) for p in others}
    mine = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    total = mine + sum(sizes.values())
    budget = limit_of(total)
    for p in sorted(others, key=lambda p: p.stat().st_mtime):
        if total <= budget:
            break
        shutil.rmtree(p, ignore_errors=True)
        total -= sizes[p]
    return total - mine


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
