"""What the sign-in page says when a sign-in is refused for another reason than a wrong password.

Gradio's sign-in form knows two answers: 200 (signed in) and 400, which it shows as
"Incorrect Credentials"; any other says nothing. The server also answers 429 (too many
failed sign-ins, or too many waiting: webui/auth/signin.py) and 403 (the right password of a
disabled account, webui/server.py), whose reasons a person at the form must see.
`LoginNotice`, an ASGI middleware, adds one script to the sign-in page (the page's HTML when
its config says `auth_required`; Gradio gives that page no `head` of its own), served from the
server's own origin as the page's Content-Security-Policy asks (`install`). The script shows
such an answer's `detail` under the form, in a live region, and clears it at the next try.
Runs on the event loop; the script runs in the browser.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

PATH = "/radixchat/login.js"
TAG = f'<script src="{PATH.lstrip("/")}"></script>'.encode()  # relative: the page may sit under a prefix
MARK = (b'"auth_required":true', b'"auth_required": true')  # the sign-in page's config

SCRIPT = """\
// radixchat: why a sign-in was refused, under the form (webui/page/routes/login_notice.py)
(() => {
  const fetchPage = window.fetch.bind(window);
  const notice = (text) => {
    let el = document.getElementById("rc-login-notice");
    if (!el && text) {
      // Gradio's form is no <form>: the notice goes after its button
      const login = [...document.querySelectorAll("button")].find((b) => /log ?in/i.test(b.textContent));
      el = document.createElement("p");
      el.id = "rc-login-notice";
      el.setAttribute("role", "alert");
      el.style.cssText = "color: var(--error-text-color, #b91c1c); margin-top: 0.75em;";
      if (login) login.insertAdjacentElement("afterend", el);
      else document.body.prepend(el);
    }
    if (el) el.textContent = text;
  };
  window.fetch = async (input, init) => {
    const url = new URL(input instanceof Request ? input.url : String(input), document.baseURI);
    const signIn = url.origin === window.location.origin && /\\/login\\/?$/.test(url.pathname);
    const response = await fetchPage(input, init);
    if (!signIn) return response;
    if (response.status === 200 || response.status === 400) {
      notice("");
      return response;
    }
    let text = "";
    try {
      const body = await response.clone().json();
      text = typeof body.detail === "string" ? body.detail : "";
    } catch (e) {}
    if (response.status === 422) text = "Give your user name and your password.";
    notice(text || `Sign-in refused (HTTP ${response.status}).`);
    return response;
  };
})();
"""


def install(app: FastAPI) -> None:
    @app.get(PATH, include_in_schema=False)
    def login_script() -> Response:
        return Response(SCRIPT, media_type="text/javascript", headers={"Cache-Control": "no-cache"})


class LoginNotice:
    """ASGI middleware: the sign-in page's HTML gets the script (see the module's docstring)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or scope["path"].rstrip("/") != "":
            return await self.app(scope, receive, send)
        start: Message | None = None
        chunks: list[bytes] = []

        async def held(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                kind = dict(message.get("headers", [])).get(b"content-type", b"")
                if not kind.startswith(b"text/html"):
                    return await send(message)
                start = message
                return None
            if start is None:
                return await send(message)
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return None
            body = b"".join(chunks)
            if any(m in body for m in MARK) and b"</head>" in body:
                body = body.replace(b"</head>", TAG + b"</head>", 1)
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, held)
