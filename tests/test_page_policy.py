"""Every response carries a Content-Security-Policy that allows nothing but the server's own
origin; each HTML page gets its own nonce on every <script> it has; the sign-in page names the
server and the model; the tab script that sends a signed-out tab to the sign-in page is served.
In process (TestClient), with the page's sign-in on. The browser side is test_page_safety.py.
"""

from __future__ import annotations

import asyncio
import re

import pytest
from fastapi.testclient import TestClient

from radixchat.core.config import Settings
from radixchat.core.store import Store
from radixchat.webui.page.routes import signed_out
from radixchat.webui.page.routes.csp import ContentPolicy, policy
from radixchat.webui.server import build_app
from tests.support.cheap import cheap_scrypt

BROWSER = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8", "Accept-Encoding": "gzip, deflate, br"}


def sources(csp: str) -> dict[str, list[str]]:
    return {d.split()[0]: d.split()[1:] for d in (x.strip() for x in csp.split(";")) if d}


def assert_only_this_origin(csp: str) -> dict[str, list[str]]:
    found = sources(csp)
    assert found["default-src"] == ["'self'"] and found["object-src"] == ["'none'"], csp
    for directive, allowed in found.items():
        for source in allowed:
            assert source in ("'self'", "'none'", "data:", "'unsafe-eval'", "'unsafe-inline'") or source.startswith(
                "'nonce-"
            ), (directive, source)
    assert "'unsafe-inline'" not in found["script-src"], csp
    return found


@pytest.fixture
def app(engine, tmp_path, tiny_model_dir):
    store = Store(tmp_path / "policy.db", scrypt=cheap_scrypt())
    store.create_user("alice", "alice-password")
    yield build_app(engine, Settings(model=str(tiny_model_dir)), store)
    store.close()


def test_every_response_carries_the_policy_and_pages_their_nonce(app, engine):
    with TestClient(app) as http:
        page = http.get("/", headers=BROWSER)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "content-encoding" not in page.headers  # read here to put the nonce in
        found = assert_only_this_origin(page.headers["content-security-policy"])
        nonce = next(s for s in found["script-src"] if s.startswith("'nonce-"))[len("'nonce-") : -1]
        tags = re.findall(r"<script\b[^>]*>", page.text)
        assert tags and all(f'nonce="{nonce}"' in t for t in tags), tags
        assert len(page.content) == int(page.headers["content-length"])
        again = http.get("/", headers=BROWSER).headers["content-security-policy"]
        assert nonce not in again  # a fresh nonce for every page

        # the sign-in page names the server and the model it serves
        assert "radixchat" in page.text and engine.loaded.model_id in page.text

        # its assets, the API, refusals and the sign-in form carry it too; assets stay compressed
        asset = re.search(r'src="\./(assets/[^"]+\.js)"', page.text).group(1)
        for path in (
            "/theme.css",
            f"/{asset}",
            "/health",
            "/v1/models",
            "/gradio_api/upload",
            "/config",
            signed_out.PATH,
        ):
            r = http.get(path, headers={"Accept-Encoding": "gzip, br"})
            assert "content-security-policy" in r.headers, path
            assert_only_this_origin(r.headers["content-security-policy"])
        assert http.get(f"/{asset}", headers={"Accept-Encoding": "gzip"}).headers.get("content-encoding") == "gzip"
        r = http.post("/login", data={"username": "alice", "password": "wrong-password"})
        assert r.status_code == 400 and "content-security-policy" in r.headers
        assert "content-security-policy" in http.head("/", headers=BROWSER).headers

        # signed in, the page loads the tab script from this origin
        assert http.post("/login", data={"username": "alice", "password": "alice-password"}).status_code == 200
        page = http.get("/", headers=BROWSER)
        assert signed_out.PATH.lstrip("/") in page.text
        script = http.get(signed_out.PATH)
        assert script.headers["content-type"].startswith("text/javascript")
        assert "location.replace" in script.text and "401" in script.text


def test_the_policy_names_no_other_host():
    for csp in (policy(), policy("abc")):
        assert_only_this_origin(csp)
        assert "http" not in csp and "*" not in csp


def run_app(inner, *, method="GET", accept=b"*/*"):
    """What `ContentPolicy` over `inner` sends, message by message, and the headers `inner` saw."""
    sent, seen = [], {}

    async def app(scope, receive, send):
        seen["headers"] = dict(scope["headers"])
        await inner(send)

    async def main():
        async def receive():
            return {"type": "http.request", "body": b""}

        async def send(message):
            sent.append(message)

        scope = {
            "type": "http",
            "method": method,
            "path": "/",
            "headers": [(b"accept", accept), (b"accept-encoding", b"br")],
        }
        await ContentPolicy(app)(scope, receive, send)

    asyncio.run(main())
    return sent, seen["headers"]


def test_streams_pass_as_they_come_and_compressed_html_is_left_alone():
    async def stream(send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for i in range(3):
            await send({"type": "http.response.body", "body": b"data: %d\n\n" % i, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    sent, headers = run_app(stream)
    assert [m["type"] for m in sent] == ["http.response.start"] + ["http.response.body"] * 4
    assert headers[b"accept-encoding"] == b"br"  # not a page: left as asked

    async def brotli_page(send):
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/html"), (b"content-encoding", b"br")],
            }
        )
        await send({"type": "http.response.body", "body": b"\x8b<script>"})

    sent, _ = run_app(brotli_page)
    assert sent[1]["body"] == b"\x8b<script>" and b"nonce" not in dict(sent[0]["headers"])[b"content-security-policy"]

    async def page(send):
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/html; charset=utf-8"), (b"content-length", b"44")],
            }
        )
        await send({"type": "http.response.body", "body": b"<script>a</script><script src=x>", "more_body": True})
        await send({"type": "http.response.body", "body": b"<scripts>"})

    sent, headers = run_app(page, accept=b"text/html")
    assert b"accept-encoding" not in headers  # a page: asked for uncompressed
    start, body = sent
    nonce = re.search(rb"'nonce-([^']+)'", dict(start["headers"])[b"content-security-policy"]).group(1)
    assert body["body"] == b'<script nonce="%s">a</script><script nonce="%s" src=x><scripts>' % (nonce, nonce)
    assert dict(start["headers"])[b"content-length"] == str(len(body["body"])).encode()
