"""The read-only page of a shared conversation: /shared/{token}, served by FastAPI, not Gradio.

The owner's "Share" (the page's "This tab") makes the token (Store.share_conversation); any
signed-in user of this server may open the link: the caller is whoever Gradio's own sign-in
cookie names (webui/auth/gate.py's GradioSide, the lookup the gate makes), and with --no-auth the
one local user. A caller with no page session is sent to the sign-in page (below). A wrong, revoked
or deleted conversation's token is the same plain 404, so tokens cannot be probed.

A signed-out visitor is sent to `/?next=/shared/{token}`: Gradio's sign-in page, which reloads
that address once signed in, and the gate (webui/auth/gate.py, `return_to`) then sends them back
here.

It shows the branch of the conversation its owner has in view (the store's tree of versions
keeps the others out of it), rendered as the chat renders it: Markdown, code blocks, links.
Title and roles go through html.escape; a message through markdown-it with HTML off (typed
HTML shows as typed) and images off (`![x](url)` is "!" and a link, as in the chat), so
nothing in it is a tag of its own, a script or a fetch from another host; the
Content-Security-Policy middleware (webui/page/routes/csp.py) covers these responses like the rest.
Runs on the event loop; the store is read and the page rendered in a worker thread.
"""

from __future__ import annotations

import asyncio
from html import escape
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from markdown_it import MarkdownIt

from radixchat.core.store import Message, NotFound, Store

PREFIX = "/shared/"
STYLE = """
body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 860px; padding: 16px; color: #1f2937; }
h1 { font-size: 1.3em; overflow-wrap: anywhere; }
.note { color: #6b7280; font-size: 0.9em; }
.msg { border: 1px solid #e5e7eb; border-radius: 8px; padding: 8px 12px; margin: 10px 0; }
.user { background: #f3f4f6; }
.role { font-weight: 600; font-size: 0.85em; color: #4b5563; }
.text { overflow-wrap: anywhere; }
.text > :first-child { margin-top: 4px; }
.text > :last-child { margin-bottom: 0; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace; font-size: 0.9em;
  background: #f3f4f6; border-radius: 4px; padding: 1px 4px; }
pre { background: #f8fafc; border: 1px solid #e5e7eb; border-radius: 6px; padding: 8px 10px; overflow-x: auto; }
pre code { background: none; padding: 0; white-space: pre; }
table { border-collapse: collapse; display: block; overflow-x: auto; }
th, td { border: 1px solid #e5e7eb; padding: 4px 8px; }
blockquote { margin: 8px 0; padding-left: 10px; border-left: 3px solid #e5e7eb; color: #4b5563; }
"""
# CommonMark with GitHub's tables and strikethrough, as the chat reads messages; typed HTML
# is text and images are links (their rule off: "!" then the link), so nothing is fetched
MARKDOWN = (
    MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    .enable(["table", "strikethrough"])
    .disable("image")
)
ROLE_NAMES = {"user": "User", "assistant": "Assistant", "system": "System"}
NOT_FOUND = (
    "<!doctype html><html><head><meta charset=utf-8><title>Not found</title></head><body><p>not found</p></body></html>"
)


def link(host_url: str, token: str) -> str:
    """The link to show the owner: the request's own scheme and host, then /shared/<token>."""
    return host_url.rstrip("/") + PREFIX + token


def render(title: str, messages: list[Message]) -> str:
    """The whole page; every piece of text escaped."""
    parts = [
        f'<div class="msg {escape(m.role)}" data-role="{escape(m.role)}">'
        f'<div class="role">{escape(ROLE_NAMES.get(m.role, m.role))}</div>'
        f'<div class="text">{MARKDOWN.render(m.content)}</div></div>'
        for m in messages
    ]
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="referrer" content="no-referrer"><title>{escape(title)} (shared)</title>'
        f"<style>{STYLE}</style></head><body>"
        f'<h1 id="shared-title">{escape(title)}</h1>'
        '<p class="note">A read-only conversation shared on this server.</p>'
        f'<main id="shared-messages">{"".join(parts)}</main></body></html>'
    )


def install(app: FastAPI, store: Store, *, no_auth: bool) -> None:
    """Registers the route; before the page's mount, which takes every path left. Reads
    app.state.page_side (a GradioSide) at request time, set once the page is mounted."""

    @app.get(PREFIX + "{token}", include_in_schema=False)
    async def shared(token: str, request: Request) -> Response:
        headers = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}
        if not no_auth:
            side = getattr(request.app.state, "page_side", None)
            if side is None or side.user(dict(request.cookies)) is None:
                back = f"{request.base_url}?next={quote(PREFIX + token, safe='/')}"
                return RedirectResponse(back, status_code=303, headers=headers)
        try:
            page = await asyncio.to_thread(shown, store, token)
        except NotFound:
            return HTMLResponse(NOT_FOUND, status_code=404, headers=headers)
        return HTMLResponse(page, headers=headers)


def shown(store: Store, token: str) -> str:
    """The page of the conversation shared by `token` (NotFound: none is)."""
    return render(*store.shared_conversation(token))
