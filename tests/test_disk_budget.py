"""The disk tier's room (core/cache/disk/budget.py): the folder never holds more than the limit
while the server runs, the limit follows the disk's free space, one user cannot fill the
tier, and `radixchat serve` has the tier on unless told otherwise.

In-process engines on the tiny random model (tests/support, fixed seed), "forced" as in
test_disk_cache.py (the memory tier's budget is 0: every node the batch does not hold is on
disk only); the default of `serve` in real processes.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from radixchat.core.cache.disk import budget as disk_budget
from radixchat.core.cache.disk import fileio as diskio
from radixchat.core.cache.disk.budget import OWNERS_MAX, RESERVE_MIN, DiskRoom, limit_for
from radixchat.core.config import DISK_AUTO
from radixchat.core.seam.requests import ChatRequest, Finished
from tests.support.conversations import QUESTIONS, SYSTEMS, engine_for, wait_disk_idle
from tests.support.server import Server

GiB = 1 << 30


def forced_engine(model_dir, tmp: Path, budget: int, **kw):
    # every node is evicted as it is stored, so nothing is ever reused in memory: the tier
    # writes all (its write policy has its own tests, test_disk_cache.py)
    kw.setdefault("cache_disk_writes", "all")
    eng = engine_for(model_dir, prefix=True, db=tmp / "radixchat.db", warm_presets=False, cache_disk_bytes=budget, **kw)
    eng.prefix.tree.budget = 0
    assert wait_disk_idle(eng), "the disk tier did not open"
    return eng


def ask(eng, system: str, question: str, owner: str | None = None) -> Finished:
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    final = eng.submit(ChatRequest(messages=msgs, owner=owner)).result()
    assert isinstance(final, Finished), final
    return final


def folder_bytes(root: Path) -> int:
    """Every file under `root`, temporary ones too (a write under way)."""
    total = 0
    for p in root.rglob("*"):
        try:
            total += p.stat().st_size if p.is_file() else 0
        except OSError:  # deleted meanwhile
            pass
    return total


def test_the_folder_never_holds_more_than_the_budget_while_running(tiny_model_dir, tmp_path, monkeypatch):
    """Many users at once, every turn a new prompt, a budget a few entries deep: after every
    write the writer thread does (the only moments the folder grows), the folder holds at
    most the budget, though running requests hold many entries that cannot be evicted."""
    budget, peaks = 300_000, []
    write = diskio.write_file

    def measured(folder, seq, data):
        path = write(folder, seq, data)
        peaks.append(folder_bytes(folder.parent))
        return path

    monkeypatch.setattr(diskio, "write_file", measured)
    eng = forced_engine(tiny_model_dir, tmp_path, budget)
    try:

        def user(u: int) -> None:
            msgs = [{"role": "system", "content": SYSTEMS[u % 4]}]
            for t in range(4):
                msgs.append({"role": "user", "content": f"{QUESTIONS[(u + t) % len(QUESTIONS)]} ({u}, {t})"})
                final = eng.submit(ChatRequest(messages=msgs)).result()
                assert isinstance(final, Finished), final
                msgs.append({"role": "assistant", "content": final.text})

        threads = [threading.Thread(target=user, args=(u,)) for u in range(12)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(300)
        assert wait_disk_idle(eng)
        eng.prefix.tree.check()
        disk, refused = eng.stats().disk_cache, eng.prefix.disk.room.refused
    finally:
        eng.stop()
    assert disk.writes > 10 and disk.evicted > 0, "the workload should have filled the budget"
    # entries the batch holds could not make room for new ones: refused, and counted where /metrics reads
    assert disk.refused == refused > 0
    assert max(peaks) <= budget, f"the folder held {max(peaks):,} bytes against a budget of {budget:,}"
    assert folder_bytes(tmp_path / "kv-cache") <= budget and disk.bytes <= budget


class FakeDisk:
    """A filesystem of SIZE bytes whose free space is what the tier's folder and another
    program (`taken`) leave of `room` bytes above the reserve."""

    SIZE = 100 * GiB

    def __init__(self, root: Path, room: int):
        self.root, self.base, self.taken = root, int(self.SIZE * 0.10) + room, 0

    def __call__(self, path) -> SimpleNamespace:
        free = self.base - folder_bytes(self.root) - self.taken
        return SimpleNamespace(f_bavail=max(0, free), f_frsize=1, f_blocks=self.SIZE)


def test_the_tier_shrinks_when_another_program_fills_the_disk(tiny_model_dir, tmp_path, monkeypatch):
    """auto: the limit is what the disk has free above its reserve (here less than a quarter
    of it); when another program takes most of that, the idle tier evicts down to the new
    limit within a few readings, and later writes keep to it."""
    fake = FakeDisk(tmp_path / "kv-cache", room=2_000_000)
    monkeypatch.setattr(disk_budget, "statvfs", fake)
    monkeypatch.setattr(disk_budget, "EVERY_S", 0.1)
    eng = forced_engine(tiny_model_dir, tmp_path, DISK_AUTO)
    try:
        assert 1_900_000 < eng.stats().disk_cache.budget <= 2_000_000
        for i in range(24):
            ask(eng, SYSTEMS[i % 4] + f" Variant {i}.", QUESTIONS[i % len(QUESTIONS)])
        assert wait_disk_idle(eng)
        before = eng.stats().disk_cache.bytes
        assert before > 450_000, before
        fake.taken = 1_700_000  # leaves the tier 300 kB above the reserve
        deadline = time.time() + 10
        while folder_bytes(tmp_path / "kv-cache") > 300_000 or not wait_disk_idle(eng):
            assert time.time() < deadline, f"the tier still holds {folder_bytes(tmp_path / 'kv-cache'):,} bytes"
            time.sleep(0.05)
        assert eng.stats().disk_cache.budget <= 300_000
        for i in range(4):
            ask(eng, SYSTEMS[i] + " Later.", QUESTIONS[i])
            assert wait_disk_idle(eng)
            assert folder_bytes(tmp_path / "kv-cache") <= 300_000
        eng.prefix.tree.check()
    finally:
        eng.stop()


def test_a_full_disk_is_told_once_and_waits_for_room(tiny_model_dir, tmp_path, monkeypatch, caplog):
    """A disk that fills between two readings of its free space refuses a write (ENOSPC):
    one warning, then no write is even tried (each counted refused) until a reading finds
    room; then one line says the tier writes again, and it does."""
    fake = FakeDisk(tmp_path / "kv-cache", room=4 * GiB)
    monkeypatch.setattr(disk_budget, "statvfs", fake)
    monkeypatch.setattr(disk_budget, "EVERY_S", 3600.0)  # the test reads the free space itself
    write, tries = diskio.write_file, {"full": 0}

    def filling(folder, seq, data):
        if fake.taken:
            tries["full"] += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write(folder, seq, data)

    monkeypatch.setattr(diskio, "write_file", filling)
    caplog.set_level(logging.INFO, logger="radixchat.disk")
    eng = forced_engine(tiny_model_dir, tmp_path, 1 * GiB)
    try:
        ask(eng, SYSTEMS[0], QUESTIONS[0])
        assert wait_disk_idle(eng)
        written = eng.stats().disk_cache.writes
        assert written > 0
        fake.taken = fake.base  # another program takes the whole disk
        for i in range(12):
            ask(eng, SYSTEMS[i % 4], f"{QUESTIONS[i % len(QUESTIONS)]} ({i})")
        assert wait_disk_idle(eng)
        full = eng.stats().disk_cache
        room = eng.prefix.disk.room
        room.read()  # the watcher's reading: still full
        ask(eng, SYSTEMS[1], "And still full?")
        assert wait_disk_idle(eng)
        assert tries["full"] == 1, f"{tries['full']} writes tried on a full disk"
        assert full.writes == written and full.refused > 0
        warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warned) == 1 and "pauses writes" in warned[0].getMessage(), [r.getMessage() for r in warned]

        fake.taken = 0  # room again
        room.read()
        for i in range(4):
            ask(eng, SYSTEMS[i], f"Room again ({i})")
        assert wait_disk_idle(eng)
        assert eng.stats().disk_cache.writes > written
        again = [r.getMessage() for r in caplog.records if "writing again" in r.getMessage()]
        assert len(again) == 1, again
        assert tries["full"] == 1 and len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
        eng.prefix.tree.check()
    finally:
        eng.stop()


def owners_bytes(root: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in root.rglob("*.safetensors"):
        owner = (diskio.read_header(p).get("__metadata__") or {}).get("owner")
        out[owner] = out.get(owner, 0) + p.stat().st_size
    return out


def test_one_user_cannot_fill_the_tier(tiny_model_dir, tmp_path):
    """mallory floods the tier with new prompts; with two users' entries on disk she holds at
    most half of it, her own oldest entries going first, and alice's entries stay: alice's
    conversation still comes back from disk after the flood."""
    budget = 400_000
    eng = forced_engine(tiny_model_dir, tmp_path, budget)
    try:
        first = ask(eng, SYSTEMS[0], "What is a list?", owner="alice")
        assert wait_disk_idle(eng)
        alice_before = owners_bytes(tmp_path / "kv-cache").get("alice", 0)
        assert alice_before > 0
        for i in range(16):
            ask(eng, SYSTEMS[1] + f" Variant {i}.", QUESTIONS[i % len(QUESTIONS)], owner="mallory")
            assert wait_disk_idle(eng)
            assert owners_bytes(tmp_path / "kv-cache").get("mallory", 0) <= budget // 2
        held = owners_bytes(tmp_path / "kv-cache")
        again = ask(eng, SYSTEMS[0], "What is a list?", owner="alice")
        disk, room = eng.stats().disk_cache, eng.prefix.disk.room
    finally:
        eng.stop()
    assert held.get("mallory", 0) > budget // 4, "mallory's flood should have filled her share"
    assert held.get("alice", 0) == alice_before, "alice's entries were evicted for mallory's"
    assert again.text == first.text and again.usage.cached_tokens > 0 and disk.loads > 0
    assert room.owner_bytes.get("alice") == alice_before


def test_the_numbers():
    """auto takes a quarter of the disk's free bytes and its own; neither auto nor a number
    takes the disk below its reserve (a tenth, at least 1 GiB); an owner's share is the limit
    over the owners with entries, between a half and a sixteenth of it; an entry larger than
    the limit or its owner's share is refused without evicting anything."""
    assert limit_for(DISK_AUTO, avail=100 * GiB, size=200 * GiB) == 25 * GiB
    assert limit_for(DISK_AUTO, avail=3 * GiB, size=8 * GiB) == 3 * GiB // 4
    assert limit_for(DISK_AUTO, avail=5 * GiB // 4, size=8 * GiB) == GiB // 4  # the reserve (1 GiB) decides
    assert limit_for(DISK_AUTO, avail=RESERVE_MIN // 2, size=4 * GiB) == 0
    assert limit_for(10 * GiB, avail=15 * GiB, size=100 * GiB) == 5 * GiB  # a tenth of 100 stays free
    assert limit_for(1 * GiB, avail=50 * GiB, size=100 * GiB) == 1 * GiB

    room = DiskRoom(Path("/nowhere"), 1600, lambda: 0, lambda: None)
    room.limit = 1600
    assert room.share("a") == 800  # alone: still half
    room.charge("a", 100)
    room.charge("", 1000)  # --no-auth's one user is not capped, nor counted
    assert room.share("a") == 800 and room.share("b") == 800 and room.owner_bytes == {"a": 100}
    for o in "bcdefghijklmnopqrst":
        room.charge(o, 10)
    assert room.share("a") == 1600 // OWNERS_MAX
    room.charge("a", -100)
    assert "a" not in room.owner_bytes
    assert not room.make_room(None, 1601, None, lambda: 0)  # (no tree touched: None would fail)
    assert not room.make_room(None, 1600 // OWNERS_MAX + 1, "z", lambda: 0)
    assert room.refused == 2


@pytest.mark.slow
def test_serve_has_the_tier_on_unless_told_otherwise(tiny_model_dir, tmp_path):
    """`radixchat serve` with no disk setting keeps a system prompt across a restart; a
    --cache-disk-bytes (0 too) is kept as given; under mlx.launch the default is off, a
    number is kept (and refused there)."""
    from radixchat.core.config import Settings
    from radixchat.webui.cli.main import serve_disk

    system = SYSTEMS[2]
    body = {
        "model": "default",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "What is a list?"}],
        "max_tokens": 4,
    }
    db = tmp_path / "served.db"
    cached = []
    for _ in range(2):
        srv = Server(tiny_model_dir, db, "--no-auth", "--no-warm-presets")
        try:
            assert srv.metric("radixchat:prefix_cache_disk_budget_bytes") > 0
            assert "radixchat:prefix_cache_disk_refused_total " in httpx.get(srv.url + "/metrics").text
            r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
            cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
            if len(cached) == 1:  # reused once, it is worth a file (--cache-disk-writes reused)
                httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60).raise_for_status()
            deadline = time.time() + 30
            while srv.metric("radixchat:prefix_cache_disk_backlog_bytes") or not srv.metric(
                "radixchat:prefix_cache_disk_files"
            ):
                assert time.time() < deadline, "nothing was written"
                time.sleep(0.1)
        finally:
            out = srv.stop()
        assert "Traceback" not in out, out
    assert cached[0] == 0 and cached[1] > 0, cached
    assert list((tmp_path / "kv-cache").rglob("*.safetensors"))

    assert Settings(cache_disk_bytes="auto").cache_disk_bytes == DISK_AUTO
    with pytest.raises(ValueError, match="a size in bytes should look like"):
        Settings(cache_disk_bytes="lots")
    assert serve_disk(Settings(), sharded=False).cache_disk_bytes == DISK_AUTO
    assert serve_disk(Settings(cache_disk_bytes=0), sharded=False).cache_disk_bytes == 0
    assert serve_disk(Settings(), sharded=True).cache_disk_bytes == 0
    assert serve_disk(Settings(cache_disk_bytes="auto"), sharded=True).cache_disk_bytes == 0
    assert serve_disk(Settings(cache_disk_bytes=5 << 20), sharded=True).cache_disk_bytes == 5 << 20
