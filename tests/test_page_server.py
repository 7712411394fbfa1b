"""The page mounted on the one FastAPI app: the API routes still answer, the page asks for sign-in."""

from __future__ import annotations

import httpx
import pytest
from fastapi.testclient import TestClient

from radixchat.core.config import Settings
from radixchat.core.store import Store
from radixchat.webui.server import build_app
from tests.support.cheap import cheap_scrypt

CHEAP = cheap_scrypt()


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "srv.db", scrypt=CHEAP)
    s.create_user("alice", "alice-password")
    yield s
    s.close()


def test_routes_answer_beside_the_page_and_sign_in_uses_the_store(engine, store, tiny_model_dir):
    app = build_app(engine, Settings(model=str(tiny_model_dir)), store)
    with TestClient(app, client=("127.0.0.1", 50000)) as http:  # /metrics answers this machine
        assert http.get("/health").json()["engine_alive"]
        assert "radixchat:num_requests_running" in http.get("/metrics").text
        assert http.get("/v1/models").status_code == 401  # the API still wants a key
        assert http.get("/v1/nothing").json()["error"]["code"] == "not_found"
        page = http.get("/")
        assert page.status_code == 200 and "auth_required" in page.text  # the sign-in form
        assert http.get("/config").status_code == 401
        assert http.post("/login", data={"username": "alice", "password": "wrong-password"}).status_code == 400
        assert http.post("/login", data={"username": "mallory", "password": "alice-password"}).status_code == 400
        ok = http.post("/login", data={"username": "alice", "password": "alice-password"})
        assert ok.status_code == 200 and ok.json() == {"success": True}
        config = http.get("/config")
        assert config.status_code == 200
        body = config.text
        assert "conv-list" in body and "fonts.googleapis" not in body
        assert "fonts.googleapis" not in http.get("/theme.css").text


def test_no_auth_serves_the_page_without_sign_in(engine, store, tiny_model_dir):
    app = build_app(engine, Settings(model=str(tiny_model_dir), no_auth=True), store)
    with TestClient(app) as http:
        assert http.get("/config").status_code == 200
        assert http.get("/v1/models").status_code == 200


@pytest.mark.slow
def test_serve_on_the_lan_prints_addresses_and_how_to_add_a_user(tiny_model_dir, tmp_path):
    import signal
    import subprocess
    import time

    from tests.support.procs import RADIXCHAT, free_port

    port = free_port()
    proc = subprocess.Popen(
        [
            RADIXCHAT,
            "serve",
            "--model",
            str(tiny_model_dir),
            "--host",
            "0.0.0.0",
            "--port",
            str(port),
            "--db",
            str(tmp_path / "empty.db"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not any("users add" in line for line in lines):
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "".join(lines)
            lines.append(line)
        while time.time() < deadline:  # up, so that Ctrl-C meets the server's own handler
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    text = "".join(lines)
    assert f"http://127.0.0.1:{port}" in text
    assert "radixchat users add NAME" in text and "no users yet" in text, text
    assert "Traceback" not in out
