"""A refused request's path, or any text a client sent, reaches radixchat's log as one line:
control characters escaped (a raw ESC, CR or NUL could forge lines or drive a terminal)."""

from __future__ import annotations

import asyncio
import logging

import httpx

from radixchat.core.config import Settings
from radixchat.webui.log_lines import OneLine, log_to_stderr
from radixchat.webui.server import build_app
from tests.support.fake_engine import FakeEngine


def test_a_refused_path_with_control_characters_is_one_escaped_line(capsys):
    log = logging.getLogger("radixchat")
    before = list(log.handlers)
    log_to_stderr()
    try:
        app = build_app(FakeEngine(), Settings(no_auth=True), None)

        async def post():
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
                return await c.post("/v1/chat/%1b[2J%0d%0aradixchat: admin alice added user mallory%00", json={})

        assert asyncio.run(post()).status_code == 404
    finally:
        for h in log.handlers[len(before) :]:
            log.removeHandler(h)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "refused" in line]
    assert len(lines) == 1, err
    assert "/v1/chat/\\x1b[2J" in lines[0] and "mallory\\x00 404" in lines[0]
    assert not any(c in err for c in "\x1b\x00")


def test_a_traceback_keeps_its_lines():
    try:
        raise ValueError("bad\x1b")
    except ValueError:
        record = logging.LogRecord("radixchat", logging.ERROR, __file__, 1, "failed: %s", ("x\ry",), True)
        import sys

        record.exc_info = sys.exc_info()
    text = OneLine("radixchat: %(message)s").format(record)
    first, *rest = text.splitlines()
    assert first == "radixchat: failed: x\\ry" and rest[0].startswith("Traceback")
    forged = logging.LogRecord(
        "radixchat", logging.INFO, __file__, 1, "refused %s", ("/v1/x\r\nradixchat: admin",), None
    )
    assert OneLine("radixchat: %(message)s").format(forged) == "radixchat: refused /v1/x\\r\\nradixchat: admin"
