"""A request a client saw answered is a request stored: rows survive SIGKILL under CPU load.

Requests go one after another, whole and streamed; the server is killed with SIGKILL the moment
the last answer has arrived, while two busy processes load the cores (the writer thread then
lags most: before answers waited for their rows, a loaded machine lost up to ~5% of them).
Every answered request must have its row in the database afterwards.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import httpx
import pytest

from radixchat.core.store import Store
from tests.support.clients import GOOD
from tests.support.server import CHEAP, Server

BUSY = "while True: pass"


@pytest.mark.slow
def test_answered_requests_keep_their_rows_through_a_kill_under_load(tiny_model_dir, tmp_path):
    db = tmp_path / "rows.db"
    with Store(db, scrypt=CHEAP) as store:
        _, key = store.create_api_key(store.create_user("alice", "correct horse battery"), "tests")
    auth = {"authorization": f"Bearer {key}"}
    hogs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2)]
    lost = []
    try:
        for round_ in range(3):
            server = Server(tiny_model_dir, db)  # the disk tier on, as serve defaults to
            answered = 0
            try:
                with httpx.Client(base_url=server.url + "/v1", headers=auth, timeout=120) as http:
                    for i in range(12):
                        body = {**GOOD, "max_tokens": 2, "stream": i % 2 == 1, "seed": i}
                        got = http.post("/chat/completions", json=body)
                        answered += got.status_code == 200 and ("[DONE]" in got.text or not body["stream"])
                        bad = http.post("/chat/completions", json={**body, "temperature": -1})
                        answered += bad.status_code == 400
            finally:
                server.proc.kill()  # at once: no shutdown flush can help
                server.proc.wait(30)
            conn = sqlite3.connect(db)
            stored = conn.execute("SELECT count(*) FROM requests").fetchone()[0]
            conn.close()
            lost.append(24 * (round_ + 1) - stored)
            assert answered == 24
    finally:
        for hog in hogs:
            hog.kill()
    assert lost == [0, 0, 0]
