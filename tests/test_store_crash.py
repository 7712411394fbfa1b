"""Crash safety: a writer killed with SIGKILL at a random moment loses no acknowledged row.

The child prints an id only after the call that wrote it returned, i.e. after the commit.
Whatever the parent read from its stdout must be in the database after the kill, and the
file must pass `PRAGMA integrity_check`.
"""

from __future__ import annotations

import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from radixchat.core.store import RequestRecord, Store, auth

REPO = Path(__file__).resolve().parent.parent
CHEAP = auth.ScryptCost(n=2**8, r=8, p=1)

CHILD = r"""
import random, sys, threading
from radixchat.core.store import auth
from radixchat.core.store import RequestRecord, Store

path, uid, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = Store(path, scrypt=auth.ScryptCost(n=2**8, r=8, p=1))
rnd = random.Random(seed)
out = threading.Lock()

def say(line):
    with out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

def replies(conv):
    # a second thread: a reply and its metrics in one transaction
    while True:
        m = store.append_reply(uid, conv, "r" * rnd.randint(0, 5000), RequestRecord(generated_tokens=3))
        say(f"reply {m.id} {m.request}")

conv = store.create_conversation(uid, f"crash {seed}").id
say(f"conv {conv}")
threading.Thread(target=replies, args=(conv,), daemon=True).start()
say("ready")
while True:
    # sizes up to ~200 KiB of UTF-8 so that a kill often lands in the middle of a write
    m = store.append_message(uid, conv, "user", "é" * rnd.randint(1, 100_000))
    say(f"msg {m.id}")
"""


def run_and_kill(path: Path, uid: int, seed: int) -> list[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), str(uid), str(seed)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    ready = threading.Event()

    def read():
        for line in child.stdout:
            if line.endswith("\n"):  # a line cut by the kill was never acknowledged
                lines.append(line.strip())
                if line == "ready\n":
                    ready.set()

    reader = threading.Thread(target=read)
    reader.start()
    try:
        assert ready.wait(60), child.stderr.read() if child.poll() is not None else "child not ready"
        time.sleep(random.Random(seed).uniform(0.2, 1.5))
        assert child.poll() is None, child.stderr.read()
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(30)
        reader.join(30)
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    return lines


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkill_loses_no_acknowledged_row(tmp_path, seed):
    path = tmp_path / "crash.db"
    with Store(path, scrypt=CHEAP) as store:
        uid = store.create_user("alice", "alice-password").id
        store.record_request(RequestRecord(user=uid))

    lines = run_and_kill(path, uid, seed)
    conv = int(next(ln for ln in lines if ln.startswith("conv ")).split()[1])
    msgs = [int(ln.split()[1]) for ln in lines if ln.startswith("msg ")]
    replies = [tuple(map(int, ln.split()[1:])) for ln in lines if ln.startswith("reply ")]
    assert msgs and replies, f"the child made no progress before the kill: {lines[:5]}"

    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert c.execute("PRAGMA foreign_key_check").fetchall() == []
    with Store(path, scrypt=CHEAP) as store:
        stored = {m.id: m for m in store.history(uid, conv)}
        missing = [m for m in msgs if m not in stored]
        assert not missing, f"acknowledged messages lost: {missing}"
        for mid, rid in replies:
            assert stored[mid].request == rid  # the reply came back with its metrics row
        assert store.totals()["requests"] >= len(replies) + 1
        # the store still works after the crash
        store.append_message(uid, conv, "user", "after the crash")
