"""The prefix cache's disk tier (core/cache/disk/tier.py): transparency, restarts, kill -9,
checksums, model identity, the disk budget, privacy on disk, warm prompts, metrics.

In-process engines on the tiny random model (tests/support, fixed seed), except kill -9,
which needs real processes. "Forced" means the memory tier's budget is 0: every node is
spilled to disk as soon as nothing holds it, so every later hit is read back from disk.
"""

from __future__ import annotations

import os
import random
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from radixchat.core.seam.requests import ChatRequest, Finished
from tests.support.conversations import SYSTEMS, conversations, engine_for, run_users, wait_disk_idle

DISK = 1 << 30
PLAN = conversations(seed=5, users=4, turns=3)


def disk_engine(model_dir, tmp: Path, forced: bool = True, **kw):
    """An engine with the disk tier on. `forced`: the tree's own budget is 0, so every node
    is spilled as it is stored. The tier writes every stored sequence unless told otherwise:
    these tests are about files, and the write policy (`reused`, the default) has its own."""
    kw.setdefault("cache_disk_bytes", DISK)
    kw.setdefault("cache_disk_writes", "all")
    eng = engine_for(model_dir, prefix=True, db=tmp / "radixchat.db", warm_presets=False, **kw)
    if forced:
        eng.prefix.tree.budget = 0  # the tree's own budget; the batch keeps --cache-bytes
    assert wait_disk_idle(eng), "the disk tier did not open"
    return eng


def files_of(tmp: Path) -> list[Path]:
    return sorted((tmp / "kv-cache").rglob("*.safetensors"))


def ask(eng, system: str, question: str, owner: str | None = None) -> Finished:
    final = eng.submit(
        ChatRequest(
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}], owner=owner
        )
    ).result()
    assert isinstance(final, Finished), final
    return final


_REFERENCES: dict = {}


def answers_without_cache(model_dir, kv_bits: int = 16) -> dict:
    """Greedy answers of PLAN with the prefix cache off (mlx-lm's own step order)."""
    if (model_dir, kv_bits) not in _REFERENCES:
        off = engine_for(model_dir, prefix=False, step_tokens=0, kv_bits=kv_bits)
        try:
            _REFERENCES[model_dir, kv_bits], _ = run_users(off, PLAN, seed=1)
        finally:
            off.stop()
    return _REFERENCES[model_dir, kv_bits]


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    return answers_without_cache(tiny_model_dir)


@pytest.mark.parametrize(
    ("kind", "kv_bits"), [("plain", 16), ("hybrid", 16), ("sliding", 16), ("plain", 8), ("plain", 4)]
)
def test_forced_disk_tier_is_transparent(kind, kv_bits, request, tmp_path):
    """Every node spilled: concurrent multi-turn users get the cache-off answers, their
    later turns hit, and those hits were read back from disk. Hybrid (short convolutions)
    and sliding-window models bring their snapshots back from disk too. At --kv-bits 8 or 4
    the files hold the codes the batch attended over, and give back exactly that."""
    fixture = {"plain": "tiny_model_dir", "hybrid": "tiny_hybrid_dir", "sliding": "tiny_sliding_dir"}
    if kv_bits != 16:  # the formats' groups need heads of 32 numbers at least
        fixture = {"plain": "tiny_wide_dir"}
    model_dir = request.getfixturevalue(fixture[kind])
    reference = answers_without_cache(model_dir, kv_bits)
    eng = disk_engine(model_dir, tmp_path, step_tokens=40, kv_bits=kv_bits)
    try:
        got, hits = run_users(eng, PLAN, seed=2)
        assert wait_disk_idle(eng)
        eng.prefix.tree.check()
        tree, disk = eng.stats().prefix_cache, eng.stats().disk_cache
    finally:
        eng.stop()
    assert got == reference
    assert all(hits[k] > 0 for k in hits if k[1] > 0), "every later turn should hit"
    assert tree.spills > 0 and disk.loads > 0 and disk.load_tokens > 0
    assert disk.dropped == 0
    assert (disk.snapshot_loads > 0) == (kind != "plain")


def test_files_at_one_kv_precision_are_never_read_at_another(tiny_wide_dir, tmp_path):
    """A file written at 8 bits is K/V in another format: a server at 16 bits (or 4) finds
    none of it, and one at 8 again finds all of it. In memory, the tree holds a token at
    about a quarter of the model's float32 K/V: a code of 8 bits a number, a 16-bit scale
    per 32 numbers."""
    readers = [({"kv_bits": 16}, False), ({"kv_bits": 4}, False), ({"kv_bits": 8}, True)]
    tree, bpt = written_then_read(tiny_wide_dir, tmp_path, {"kv_bits": 8}, readers)
    assert tree.cached_tokens > 0 and tree.bytes == tree.cached_tokens * bpt * (8 + 16 / 32) // 32


def test_files_at_one_group_size_are_never_read_at_another(tiny_wider_dir, tmp_path):
    """--kv-group-size 64 is another precision than 8 bits' own 32: a server at the default
    group finds none of its files, one at 64 again all of them."""
    wrote = {"kv_bits": 8, "kv_group_size": 64}
    written_then_read(tiny_wider_dir, tmp_path, wrote, [({"kv_bits": 8}, False), (wrote, True)])


def written_then_read(model_dir, tmp_path, wrote: dict, readers: list[tuple[dict, bool]]):
    """An engine with `wrote`'s settings caches a prompt on disk; then an engine with each
    reader's finds its files (True) or none of them (False). The writer's tree and bytes a
    token."""
    eng = disk_engine(model_dir, tmp_path, forced=False, **wrote)
    try:
        ask(eng, SYSTEMS[0], "What is a tuple?")
        assert wait_disk_idle(eng)
        tree, bpt = eng.stats().prefix_cache, eng.kv_bytes_per_token
    finally:
        eng.stop()
    assert files_of(tmp_path)
    for settings, found in readers:
        eng = disk_engine(model_dir, tmp_path, forced=False, **settings)
        try:
            again = ask(eng, SYSTEMS[0], "What is a tuple?")
            disk = eng.stats().disk_cache
        finally:
            eng.stop()
        assert (disk.adopted > 0) == found and (again.usage.cached_tokens > 0) == found, (settings, disk)
    return tree, bpt


def test_restart_keeps_hits_privately_and_files_are_private(tiny_model_dir, tmp_path):
    """A second engine over the same folder serves the first one's prefixes from disk,
    each owner's conversation to that owner only, in another namespace numbering."""
    system, question = SYSTEMS[2], "What does yield do?"
    first = disk_engine(tiny_model_dir, tmp_path, forced=False, cache_disk_writes="reused")
    try:
        a1 = ask(first, system, question, owner="alice")  # alice takes namespace 1 here
        ask(first, system, question, owner="alice")  # reused: now worth a file
        ask(first, system, question, owner="carol")  # stored once: only the system message
        assert wait_disk_idle(first)
    finally:
        first.stop()
    files = files_of(tmp_path)
    assert files
    for p in [tmp_path / "kv-cache", *{f.parent for f in files}]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o700, p
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f

    second = disk_engine(tiny_model_dir, tmp_path, forced=False, cache_disk_writes="reused")
    try:
        assert second.stats().disk_cache.adopted == len(files)
        b = ask(second, system, question, owner="bob")  # first here: alice's old number
        a2 = ask(second, system, question, owner="alice")
        c2 = ask(second, system, question, owner="carol")
        disk = second.stats().disk_cache
        shared = len(second.loaded.tokenizer.apply_chat_template([{"role": "system", "content": system}]))
    finally:
        second.stop()
    assert b.usage.cached_tokens == shared, "bob may reuse the system message, nothing of alice's"
    assert a2.usage.cached_tokens > shared and a2.text == a1.text
    assert c2.usage.cached_tokens == shared, "carol's question was stored once: never written"
    assert disk.loads > 0


def test_only_what_was_reused_is_written(tiny_model_dir, tmp_path):
    """--cache-disk-writes reused (the default): a prompt stored once costs no disk work
    (a flood of distinct prompts writes nothing); the conversation's next turn, which goes
    through it, writes it, but not its own new tail; evicted, a node never reused is
    dropped, a reused one spilled and read back."""
    system, q1 = SYSTEMS[1], "What is a tuple?"
    eng = disk_engine(tiny_model_dir, tmp_path, forced=False, cache_disk_writes="reused")
    try:
        first = ask(eng, system, q1, owner="alice")
        assert wait_disk_idle(eng)
        assert eng.stats().disk_cache.writes == 0 and not files_of(tmp_path)
        for q in ("Why is the sky blue?", "Name a prime.", "Count to three."):
            ask(eng, system, q, owner="mallory")  # the system message is reused, her prompts not

        turn2 = [
            {"role": "system", "content": system},
            {"role": "user", "content": q1},
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": "And a list?"},
        ]
        again = eng.submit(ChatRequest(messages=turn2, owner="alice")).result()
        assert isinstance(again, Finished) and again.usage.cached_tokens > 0
        assert wait_disk_idle(eng)
        unwritten = [n for n in _nodes(eng.prefix.tree) if n.disk is None]
        assert len(files_of(tmp_path)) == eng.stats().disk_cache.writes > 0
        assert len(unwritten) >= 4  # mallory's three prompts and alice's second turn's tail

        eng.prefix.tree.budget = 0  # the next store evicts everything unlocked
        ask(eng, "Another system message entirely.", "Hello?", owner="bob")
        assert wait_disk_idle(eng)
        tree, disk = eng.stats().prefix_cache, eng.stats().disk_cache
        assert tree.spills > 0 and disk.unwritten >= 4
        eng.prefix.tree.budget = 1 << 30
        third = eng.submit(ChatRequest(messages=turn2, owner="alice")).result()
        disk = eng.stats().disk_cache
    finally:
        eng.stop()
    assert isinstance(third, Finished) and third.text == again.text
    # what her second turn reused came back from disk; its own tail was recomputed
    assert third.usage.cached_tokens >= again.usage.cached_tokens and disk.loads > 0


KILL_CHILD = r"""
import sys, threading
from radixchat.core.config import Settings
from radixchat.core.engine.engine import Engine
from tests.support.conversations import conversations, run_users
model, db = sys.argv[1], sys.argv[2]
eng = Engine(Settings(model=model, db=db, max_batch=8, max_prefill_batch=4, max_tokens=12,
                      cache_disk_bytes=1 << 30, cache_disk_writes="all", warm_presets=False)).start(timeout=120)
eng.prefix.tree.budget = 0
print("ready", flush=True)
seed = 0
while True:
    seed += 1
    run_users(eng, conversations(seed=seed, users=3, turns=2), seed=seed)
"""


@pytest.mark.slow
def test_kill_9_during_writes_never_serves_a_torn_entry(tiny_model_dir, tmp_path, reference):
    """Killed mid-work again and again: every file a restart sees is whole (its checksum
    holds, none is dropped), a torn temporary file is never adopted, and the answers
    served from what survived are the cache-off ones."""
    rng = random.Random(3)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    for _ in range(4):
        child = subprocess.Popen(
            [sys.executable, "-c", KILL_CHILD, str(tiny_model_dir), str(tmp_path / "radixchat.db")],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        try:
            assert child.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.3, 1.5))
        finally:
            child.kill()  # SIGKILL: no atexit, no flush
            child.wait()
    files = files_of(tmp_path)
    assert len(files) >= 2, "the children should have written entries"
    eng = disk_engine(tiny_model_dir, tmp_path)
    try:
        opened = eng.stats().disk_cache
        got, _hits = run_users(eng, PLAN, seed=4)
        assert wait_disk_idle(eng)
        eng.prefix.tree.check()
        disk = eng.stats().disk_cache
    finally:
        eng.stop()
    assert not list((tmp_path / "kv-cache").rglob("*.tmp")), "a torn temporary file was left"
    assert opened.dropped == 0 and disk.dropped == 0, "a visible file was torn"
    assert opened.adopted > 0 and disk.loads > 0
    assert got == reference


def damaged_rerun(model_dir, tmp_path, system: str, question: str, damage):
    """Answer once with the disk tier, `damage` its largest file, answer again in a fresh
    engine: (first answer, second answer, the second engine's disk stats, the damaged file)."""
    eng = disk_engine(model_dir, tmp_path)
    try:
        cold = ask(eng, system, question)
        assert wait_disk_idle(eng)
    finally:
        eng.stop()
    victim = max(files_of(tmp_path), key=lambda p: p.stat().st_size)
    damage(victim)
    eng = disk_engine(model_dir, tmp_path)
    try:
        again = ask(eng, system, question)
        assert wait_disk_idle(eng)
        eng.prefix.tree.check()
        disk = eng.stats().disk_cache
    finally:
        eng.stop()
    return cold, again, disk, victim


def test_corrupted_file_is_dropped_not_served(tiny_model_dir, tmp_path):
    def flip(victim):
        data = bytearray(victim.read_bytes())
        for i in range(len(data) - 64, len(data) - 32):  # in the K/V, not the header
            data[i] ^= 0x5A
        victim.write_bytes(bytes(data))

    cold, again, disk, victim = damaged_rerun(tiny_model_dir, tmp_path, SYSTEMS[1], "Explain generators.", flip)
    assert disk.dropped == 1
    assert not victim.exists()
    assert again.text == cold.text


def test_changed_model_file_ignores_old_entries(tiny_model_dir, tmp_path):
    import mlx.core as mx

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    eng = disk_engine(model, tmp_path, forced=False)
    try:
        ask(eng, SYSTEMS[0], "What is a tuple?")
        assert wait_disk_idle(eng)
    finally:
        eng.stop()
    assert files_of(tmp_path)
    weights = next(model.glob("*.safetensors"))
    arrays = mx.load(str(weights))
    name = sorted(arrays)[0]
    arrays[name] = arrays[name] * 1.001  # an edit that keeps the file's size
    mx.save_safetensors(str(weights), arrays, metadata={"format": "mlx"})
    eng = disk_engine(model, tmp_path, forced=False)
    try:
        again = ask(eng, SYSTEMS[0], "What is a tuple?")
        disk = eng.stats().disk_cache
    finally:
        eng.stop()
    assert disk.adopted == 0 and disk.loads == 0
    assert again.usage.cached_tokens == 0


def test_disk_budget_holds(tiny_model_dir, tmp_path):
    budget = 250_000
    eng = disk_engine(tiny_model_dir, tmp_path, cache_disk_bytes=budget)
    try:
        for i in range(8):
            ask(eng, SYSTEMS[i % 4] + f" Variant {i}.", QUESTIONS_ALL[i % len(QUESTIONS_ALL)])
            assert wait_disk_idle(eng)
            on_disk = sum(p.stat().st_size for p in files_of(tmp_path))
            assert on_disk <= budget and eng.stats().disk_cache.bytes <= budget
        eng.prefix.tree.check()
        disk = eng.stats().disk_cache
    finally:
        eng.stop()
    assert disk.evicted > 0, "the workload should have exceeded the disk budget"


QUESTIONS_ALL = ["What is a list?", "How do dicts work?", "Explain generators.", "Why use sets?"]


def test_warm_prompts_are_cached_before_the_first_user(tiny_model_dir, tmp_path):
    warm = tmp_path / "warm.txt"
    warm.write_text(SYSTEMS[3] + "\n\nAnother system prompt.\n")
    eng = engine_for(tiny_model_dir, prefix=True, db=tmp_path / "radixchat.db", warm_prompts=warm, warm_presets=False)
    try:
        deadline = time.time() + 30
        while eng.prefix.tree.stats.inserted_tokens == 0 or eng.stats().inflight:
            assert time.time() < deadline, "warm prompts were not prefilled"
            time.sleep(0.05)
        first = ask(eng, SYSTEMS[3], "What is a list?", owner="dave")
        shared = len(eng.loaded.tokenizer.apply_chat_template([{"role": "system", "content": SYSTEMS[3]}]))
    finally:
        eng.stop()
    assert first.usage.cached_tokens == shared


def test_metrics_and_the_server_tab_show_the_disk_tier(tiny_model_dir, tmp_path):
    from radixchat.webui.api.metrics import Metrics
    from radixchat.webui.page.logic.dashboard import disk_line
    from tests.support.metrics import metric_value

    eng = disk_engine(tiny_model_dir, tmp_path)
    try:
        ask(eng, SYSTEMS[0], "What is a list?")
        ask(eng, SYSTEMS[0], "What is a list?")
        assert wait_disk_idle(eng)
        text = Metrics(eng).render().decode()
        disk = eng.stats().disk_cache
    finally:
        eng.stop()
    line = disk_line(disk)
    assert line.startswith("| Disk cache | ") and f"of {DISK / 2**30:,.1f} GiB" in line, line
    assert f"{disk.loads:,} hit" in line and f"{disk.writes:,} write" in line and " ms each" in line, line
    assert disk.loads > 0 and "dropped" not in line
    assert "dropped" in disk_line(replace(disk, dropped=2)) and disk_line(None).startswith("| Disk cache | off")
    assert metric_value(text, "radixchat:prefix_cache_disk_bytes") > 0
    assert metric_value(text, "radixchat:prefix_cache_disk_writes_total") > 0
    assert metric_value(text, "radixchat:prefix_cache_disk_hits_total") > 0
    assert metric_value(text, "radixchat:prefix_cache_disk_read_seconds_total") > 0


def test_a_write_cut_short_is_never_visible_and_a_torn_file_is_dropped(tiny_model_dir, tmp_path, monkeypatch):
    """The write protocol: a write that fails before its rename leaves nothing visible; a
    kill's temporary file is removed at the next start; a file torn under its final name is
    caught by its digest."""
    from radixchat.core.cache.disk import fileio as diskio

    folder = tmp_path / "f"
    diskio.make_private_dir(folder)

    def full(fd):
        raise OSError("no space left on device")

    monkeypatch.setattr(diskio.os, "fsync", full)
    with pytest.raises(OSError):
        diskio.write_file(folder, 7, b"x" * 100)
    monkeypatch.undo()
    assert not list(folder.iterdir())
    assert diskio.write_file(folder, 8, b"y" * 100).name == diskio.file_name(8, diskio.digest(b"y" * 100))

    def tear(victim):
        (victim.parent / ".000000000fff.tmp").write_bytes(victim.read_bytes()[:100])  # killed mid-write
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])  # torn in place

    cold, again, disk, victim = damaged_rerun(tiny_model_dir, tmp_path, SYSTEMS[0], "Why use sets?", tear)
    assert disk.dropped == 1 and again.text == cold.text
    assert not list(victim.parent.glob("*.tmp"))


class SimRef:
    """A simulated disk reference: tokens of a sequence, and its file's reference count."""

    def __init__(self, tokens, files, fid=None):
        self.tokens, self.files, self.n, self.node = tuple(tokens), files, len(tokens), None
        self.fid = fid if fid is not None else len(files)
        files[self.fid] = files.get(self.fid, 0) + 1

    def split(self, k):
        self.files[self.fid] -= 1
        return SimRef(self.tokens[:k], self.files, self.fid), SimRef(self.tokens[k:], self.files, self.fid)

    def release(self):
        self.files[self.fid] -= 1
        assert self.files[self.fid] >= 0


def test_two_tier_tree_keeps_its_invariants_under_random_work():
    """The tree alone (simulated segments and files): spills instead of drops, splits of
    spilled nodes, reads back, disk eviction and lost files keep `check` true, keep every
    node's segment and file range exactly its edge, and leak no file reference."""
    from radixchat.core.cache.radix import RadixCache
    from tests.support.segments import SimSeg

    rng = random.Random(9)
    files: dict[int, int] = {}
    t = RadixCache(budget_bytes=200)
    t.spill = lambda node: t.set_disk(node, SimRef(node.key, files))
    held, most_spilled, read_back = [], 0, 0
    for _step in range(600):
        op = rng.random()
        seq = [rng.randrange(3) for _ in range(rng.randrange(1, 12))]
        if op < 0.45:
            t.insert(seq, lambda s, e, seq=seq: SimSeg(seq[s:e]))
        elif op < 0.6:
            m = t.walk(seq)
            for n in m.path:
                if n.spilled:
                    t.attach(n, SimSeg(n.disk.tokens))  # read back
                    read_back += 1
            if m.node is not None:
                t.lock(m.node)
                held.append(m.node)
        elif op < 0.75 and held:
            t.unlock(held.pop(rng.randrange(len(held))))
        elif op < 0.85:
            live = sum(1 for c in files.values() if c)
            t.fit_disk(lambda: sum(1 for c in files.values() if c) > live // 2)  # noqa: B023
        elif op < 0.9:
            m = t.walk(seq)
            if m.path:
                t.drop(m.path[-1])  # its file was found corrupt
        else:
            t.fit()
        t.check()
        most_spilled = max(most_spilled, t.disk_nodes)
        stack = list(t.root.children.values())
        while stack:
            n = stack.pop()
            assert n.seg is None or n.seg.tokens == n.key
            assert n.disk is None or n.disk.tokens == n.key
            stack.extend(n.children.values())
        m = t.match(seq)
        assert all(not n.spilled for n in m.path)
    for node in held:
        t.unlock(node)
    t.check()
    assert most_spilled > 5 and read_back > 5 and t.stats.spills > 0
    refs = sum(1 for n in _nodes(t) if n.disk is not None)
    assert refs == sum(files.values()), "a file reference leaked"


def _nodes(t):
    stack = list(t.root.children.values())
    while stack:
        n = stack.pop()
        yield n
        stack.extend(n.children.values())


def test_a_named_cache_dir_is_left_as_it_was(tiny_model_dir, tmp_path):
    """--cache-dir naming a shared folder: its mode stays, and nothing of it but this
    tier's own folders is ever pruned (however small the budget)."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    (shared / "notes").mkdir()
    (shared / "notes" / "todo.txt").write_text("keep me " * 1000)
    stale = shared / ("0" * 32)  # another model's folder of this tier
    stale.mkdir()
    (stale / "000000000000.{}.safetensors".format("0" * 32)).write_bytes(b"\0" * 50_000)
    eng = disk_engine(tiny_model_dir, tmp_path, cache_dir=shared, cache_disk_bytes=40_000)
    eng.stop()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    assert (shared / "notes" / "todo.txt").exists() and not stale.exists()


def test_doctor_names_the_folder_and_what_it_holds(tmp_path):
    from radixchat.core.config import Settings
    from radixchat.core.platform.doctor import _disk_tier

    off = dict(_disk_tier(Settings(db=tmp_path / "radixchat.db")))
    assert off["disk cache"].startswith("off")
    folder = tmp_path / "kv-cache" / ("a" * 32)
    folder.mkdir(parents=True)
    for i in range(3):
        (folder / f"{i:012x}.{'b' * 32}.safetensors").write_bytes(b"\0" * (1 << 20))
    line = dict(_disk_tier(Settings(db=tmp_path / "radixchat.db", cache_disk_bytes=1 << 30)))["disk cache"]
    assert str(tmp_path / "kv-cache") in line and "3.0 MiB in 3 entries of 1024 MiB" in line
