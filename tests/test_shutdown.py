"""Stopping a real server while it works: SIGTERM (a service manager's stop) or one Ctrl-C
(SIGINT), with a page writing a reply in Chromium and an API stream running.

The process exits within seconds (scaled by the machine's load) with status 0 and nothing
like a traceback in its output, and its store, read after the exit, holds both: the page's
reply with its text so far, stored as stopped (finish "cancelled"), and the API request's
row, cancelled too. The API stream ends with its last event rather than being cut: an error
event saying the server is shutting down. What
the server does on a stop is webui/cli/main.py's; the replies' ends are the engine's and
webui/request_end.py's. Screenshots go to test-output/shutdown/.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from radixchat.core.store import Store
from tests.support.browser import OUTPUT, WIDE, Shots
from tests.support.page import ready, send, sign_in
from tests.support.procs import kill_group, scaled
from tests.support.randmodel import build_random_model
from tests.support.server import CHEAP, page_server

MAX_TOKENS = 3000  # far more than the few seconds before the signal write: both still run then
BUTTON = "document.querySelector('#send').innerText.trim()"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    # the page tests' model, with room for replies that run long after the signal
    return build_random_model(tmp_path_factory.mktemp("shutdown") / "model", dim=128, layers=4, context=4096)


@pytest.fixture(scope="module")
def shots():
    return Shots(OUTPUT / "shutdown")


def _api_key(db: Path) -> str:
    with Store(db, scrypt=CHEAP) as store:
        _, key = store.create_api_key(store.get_user("alice"), "shutdown test")
    return key


def _stream(url: str, key: str, got: dict) -> None:
    """A long API stream, its lines kept in `got` as they come."""
    headers = {"Authorization": f"Bearer {key}"}
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": "Count for as long as you can"}],
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "ignore_eos": True,
    }
    got["lines"] = lines = []
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=120) as r:
            for line in r.iter_lines():
                if line:
                    lines.append(line)
    except httpx.HTTPError as e:
        got["broken"] = repr(e)


def _running(url: str) -> int:
    return httpx.get(url + "/health", timeout=10).json()["active_requests"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_with_a_page_reply_and_an_api_stream_running_ends_in_seconds(model, browser, shots, tmp_path, sig):
    srv = page_server(model, tmp_path, "--max-tokens", str(MAX_TOKENS))
    context = browser.new_context(viewport=WIDE)
    try:
        key = _api_key(srv.db)
        page = context.new_page()
        sign_in(page, srv.url, "alice")
        ready(page)
        send(page, "Tell me everything about generators")
        page.wait_for_function(f"{BUTTON} === 'Stop'", timeout=30_000)
        got: dict = {}
        client = threading.Thread(target=_stream, args=(srv.url, key, got), daemon=True)
        client.start()
        deadline = time.monotonic() + scaled(30)
        while _running(srv.url) < 2:  # both replies under way in the engine
            assert time.monotonic() < deadline, "the page's reply and the API stream never ran together"
            time.sleep(0.1)
        shots(page, f"{sig.name}-replying")

        t0 = time.monotonic()
        srv.proc.send_signal(sig)
        try:
            status = srv.proc.wait(timeout=scaled(10))
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {time.monotonic() - t0:.0f} s after {sig.name}: {srv.output()}")
        took = time.monotonic() - t0
        out = srv.output()
        assert status == 0, out
        assert "Traceback" not in out and "CancelledError" not in out, out
        print(f"{sig.name}: exited in {took:.1f} s")
        client.join(scaled(10))
        assert not client.is_alive(), "the API stream was still open after the server had exited"

        # the stream ended with its last event, not cut mid-reply: an error that says why
        # (a finish reason of "cancelled" is none an OpenAI client knows)
        assert "broken" not in got, got
        lines = got["lines"]
        assert lines[-1] == "data: [DONE]", lines[-3:]
        last = json.loads(lines[-2][6:])
        assert "shutting down" in last["error"]["message"] and last["error"]["type"] == "server_error", last
        finish = [json.loads(x[6:])["choices"][0]["finish_reason"] for x in lines[:-2]]
        assert set(finish) == {None}, lines[-3:]

        with sqlite3.connect(srv.db) as db:
            reply = db.execute(
                "SELECT m.content, r.finish_reason FROM messages m JOIN requests r ON r.id = m.request"
                " WHERE m.role = 'assistant'"
            ).fetchall()
            api = db.execute("SELECT finish_reason, generated_tokens FROM requests WHERE route IS NOT NULL").fetchall()
        assert len(reply) == 1 and reply[0][0] and reply[0][1] == "cancelled", reply  # stopped, text kept
        assert len(api) == 1 and api[0][0] == "cancelled" and 0 < api[0][1] < MAX_TOKENS, api
    finally:
        context.close()
        kill_group(srv.proc)
