"""Real `radixchat serve` processes for end-to-end tests: `Server` on a free loopback port
(started in a process group of its own, waited for as long as the machine's load asks,
stopped with SIGINT, its /metrics read; on every path out of a start or a stop that did not
end it, an interrupt too, its group is killed and reaped: tests/support/procs.py), one whose API wants keys
(`keyed_server`), one with the page's users in its store (`page_server`, PASSWORDS), and
`Listener`, an HTTP server elsewhere on loopback that records what a page fetches from it."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from radixchat.core.store import Store
from tests.support.browser import CHROMIUM
from tests.support.cheap import cheap_scrypt
from tests.support.metrics import metric_value
from tests.support.procs import RADIXCHAT, free_port, kill_group, scaled, spawn, wait_ready

CHEAP = cheap_scrypt()
PASSWORDS = {"alice": "alice-password", "bob": "bob-password"}  # the page servers' users


class Server:
    """`radixchat serve --model model_dir --db db` on a free loopback port, once /health answers
    (within `timeout` seconds on an idle machine); `stop` sends SIGINT and returns everything
    it printed."""

    def __init__(self, model_dir, db, *extra, env=None, timeout: float = 120):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = spawn(
            [
                RADIXCHAT,
                "serve",
                "--model",
                str(model_dir),
                "--port",
                str(self.port),
                "--db",
                str(db),
                "--max-tokens",
                "16",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
        )
        # read all along: a server that writes more than a pipe holds (its log) would block
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._lines.extend, args=(self.proc.stdout,), daemon=True)
        self._reader.start()
        wait_ready(self.proc, self.url + "/health", timeout, self._failed)

    def _failed(self, why: str) -> Exception:
        if self.proc.poll() is not None:
            return RuntimeError(self.output())
        return TimeoutError(f"server {why}: {''.join(self._lines)}")

    def output(self) -> str:
        """What it printed so far (all of it once it has exited)."""
        if self.proc.poll() is not None:
            self._reader.join(10)
        return "".join(self._lines)

    def stop(self):
        """SIGINT, and its group killed if it has not stopped within 30 s (`scaled`), or on an
        interrupt; raises TimeoutError then, after reaping it."""
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=scaled(30))
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"server did not stop on SIGINT: {self.output()}") from None
        finally:
            kill_group(self.proc)  # what it left behind too; reaped either way
        return self.output()

    def metric(self, name: str, **labels: str) -> float:
        return metric_value(httpx.get(self.url + "/metrics").text, name, **labels)


def stop_clean(srv) -> None:
    out = srv.stop()
    assert "Traceback" not in out, out


def keyed_server(tiny_model_dir, tmp_path_factory):
    """(server, alice's key, a revoked key, the db): a real server whose API wants keys."""
    db = tmp_path_factory.mktemp("api") / "api.db"
    with Store(db) as store:
        alice = store.create_user("alice", "correct horse battery")
        _, key = store.create_api_key(alice, "tests")
        _, revoked = store.create_api_key(alice, "old")
        store.revoke_api_key(revoked)
    server = Server(tiny_model_dir, db)
    yield server, key, revoked, db
    out = server.stop()
    assert "Traceback" not in out, out


def page_server(model, folder: Path, *flags: str):
    """A real server with the page, its store holding PASSWORDS' users; stop it with stop_clean."""
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is missing: run `.ci/setup --test` (apt-get install chromium)")
    db = folder / "page.db"
    with Store(db, scrypt=CHEAP) as store:
        for name, password in PASSWORDS.items():
            store.create_user(name, password)
    srv = Server(model, db, *flags)
    srv.db = db
    return srv


class Listener:
    """An HTTP server on another loopback port that records every request it gets."""

    def __init__(self):
        self.hits: list[str] = []
        hits = self.hits

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                hits.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "image/gif")
                self.end_headers()

            do_POST = do_HEAD = do_GET

            def log_message(self, *args):
                pass

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
