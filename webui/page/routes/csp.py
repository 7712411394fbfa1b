"""The page may load nothing but the server's own files: a Content-Security-Policy on every response.

`ContentPolicy`, an ASGI middleware outermost on the app, adds the header to every HTTP
response: the page, its sign-in page, their assets, refusals, and the API too (harmless
there). What each source is for is said in `policy`. Gradio's page carries inline scripts of
its own (the page's config, a loader), so every HTML page gets a fresh nonce: its <script>
tags are given it and the policy allows scripts with it besides the server's own files. An
inline script or event handler that got into the page any other way does not run, and nothing
is fetched from another host, whatever a message holds (webui/page/logic/markup.py keeps messages
to text, code and links in the first place).

To give the page's <script> tags the nonce, this reads the HTML it passes on, so the HTML
must come uncompressed: a request that accepts HTML (a browser opening the page) has its
Accept-Encoding taken off before Gradio's Brotli/gzip middleware sees it. Other responses,
the page's event streams included, pass through as they come. Runs on the server's event
loop.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("radixchat.page")

SCRIPT_TAG = re.compile(rb"<script(?=[\s>])")


def policy(nonce: str | None = None) -> str:
    """The policy for one response; `nonce` for an HTML page's own inline scripts."""
    return "; ".join(
        [
            # anything not named below (fetches and event streams, fonts, media, frames, workers,
            # the manifest): this server only
            "default-src 'self'",
            # the page's files and its own inline scripts; vega (the Server tab's plots) compiles its
            # chart expressions with Function(): without 'unsafe-eval' the plots stay empty
            "script-src 'self'" + (f" 'nonce-{nonce}'" if nonce else "") + " 'unsafe-eval'",
            # Gradio sets the theme and the page's CSS as <style> elements, and style attributes
            "style-src 'self' 'unsafe-inline'",
            "img-src 'self' data:",  # Gradio's icons are data: URLs in its CSS
            "object-src 'none'",
            "base-uri 'self'",  # the page sets <base href="./">
            "form-action 'self'",
            "frame-ancestors 'self'",  # not framed by another site's page
        ]
    )


class ContentPolicy:
    """ASGI middleware (see the module's docstring)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if accepts_html(scope):
            scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k != b"accept-encoding"]}
        rewrite = scope["method"] == "GET"
        start: Message | None = None
        chunks: list[bytes] = []

        async def send_with_policy(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                headers = message.get("headers", [])
                if rewrite and is_plain_html(headers):
                    start = message  # sent with the body, once the nonce is in it
                    return
                if rewrite and is_html(headers):  # its inline scripts will not run
                    log.warning("a compressed HTML page went out without a nonce: %s", scope["path"])
                message = {
                    **message,
                    "headers": [
                        *drop(headers, b"content-security-policy"),
                        (b"content-security-policy", policy().encode()),
                    ],
                }
                return await send(message)
            if start is None or message["type"] != "http.response.body":
                return await send(message)
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            nonce = secrets.token_urlsafe(16)
            body = SCRIPT_TAG.sub(b'<script nonce="' + nonce.encode() + b'"', b"".join(chunks))
            headers = [
                *drop(start.get("headers", []), b"content-security-policy", b"content-length"),
                (b"content-length", str(len(body)).encode()),
                (b"content-security-policy", policy(nonce).encode()),
            ]
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, send_with_policy)


def accepts_html(scope: Scope) -> bool:
    accept = next((v for k, v in scope["headers"] if k == b"accept"), b"")
    return b"text/html" in accept


def header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    return next((v for k, v in headers if k.lower() == name), None)


def is_html(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    return (header(headers, b"content-type") or b"").lower().startswith(b"text/html")


def is_plain_html(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """HTML this can read: not compressed."""
    return is_html(headers) and header(headers, b"content-encoding") in (None, b"identity")


def drop(headers: Iterable[tuple[bytes, bytes]], *names: bytes) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in headers if k.lower() not in names]
