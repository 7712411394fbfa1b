"""The benchmark against mlx_lm.server starts every server empty, also when a run reuses the
folder of an earlier one (tests.support.procs.clear_state, which loadtests.bench_vs_mlxlm
calls before each start)."""

from __future__ import annotations

from tests.support.procs import clear_state


def test_an_earlier_runs_database_and_disk_tier_are_gone(tmp_path):
    db = tmp_path / "radixchat-defaults-32-r1.db"
    for path in (db, tmp_path / "radixchat-defaults-32-r1.db-wal", tmp_path / "radixchat-defaults-32-r1.db-shm"):
        path.write_bytes(b"old")
    tier = db.with_suffix(".kv")
    (tier / "owner").mkdir(parents=True)
    (tier / "owner" / "segment.bin").write_bytes(b"k/v of the earlier run")
    keep = tmp_path / "radixchat-defaults-32-r1.log"
    keep.write_text("the log is rewritten by the new server, not removed")
    clear_state(db)
    assert sorted(p.name for p in tmp_path.iterdir()) == [keep.name]
    clear_state(db)  # nothing there: no error
