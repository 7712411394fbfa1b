"""A tab whose sign-in has ended shows the sign-in page, not a bare "Error" beside old chats.

The page's "Sign out" is Gradio's /logout, opened in the same tab: it ends every session of
that user on the server and lands on the sign-in page. (Every one: Gradio's sign-out of one
session looks only at its Secure cookie, which a browser on a plain-HTTP LAN never keeps.)
Another tab still showing that user's chats, or one whose cookie was removed, is refused by
the gate (webui/auth/gate.py) from then on: 401, or 403 once its browser signed in as someone
else, which Gradio would show as a red "Error" next to the previous user's chats. `SCRIPT`
watches the page's calls to /gradio_api/ and on such a refusal loads the page again, which
the server answers with the sign-in page (or the page of whoever is signed in now); the
refused call is left unanswered so that nothing shows an error meanwhile.
It also reloads a page brought back from the browser's back-forward cache, so Back after
signing out does not show the chats again, and titles Gradio's toast for a lost connection
"Reconnecting" (Gradio titles it "Error", though the page reloads itself once the server is back).

`install` serves it from the app as a file of the server's own origin (the page's
Content-Security-Policy runs no inline script but Gradio's own), and `HEAD` loads it into the
page through Gradio's `head`. Runs on the event loop.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import Response

PATH = "/radixchat/tab.js"
HEAD = f'<script src="{PATH.lstrip("/")}"></script>'  # relative: the page may sit under a prefix

SCRIPT = """\
// radixchat: a tab whose sign-in ended goes to the sign-in page (webui/page/routes/signed_out.py)
(() => {
  const fetchPage = window.fetch.bind(window);
  let leaving = false;
  const signIn = () => {
    if (!leaving) {
      leaving = true;
      window.location.replace(document.baseURI);
    }
    return new Promise(() => {});  // nothing to show as an error: the page is going
  };
  window.fetch = async (input, init) => {
    const response = await fetchPage(input, init);
    const url = new URL(input instanceof Request ? input.url : String(input), document.baseURI);
    const ours = url.origin === window.location.origin && url.pathname.includes("/gradio_api/");
    return ours && (response.status === 401 || response.status === 403) ? signIn() : response;
  };
  window.addEventListener("pageshow", (event) => {
    if (event.persisted) window.location.reload();
  });
  // Gradio titles a toast by its kind, and a lost connection is an "Error": it is a wait (the
  // page reloads itself once the server answers again), so it is titled as one
  new MutationObserver(() => {
    for (const toast of document.querySelectorAll(".toast-body.error")) {
      const title = toast.querySelector(".toast-title")?.firstChild;
      if (title?.nodeValue?.trim() === "Error" && /connection to the server was lost/i.test(toast.innerText)) {
        title.nodeValue = "Reconnecting ";
      }
    }
  }).observe(document.documentElement, {childList: true, subtree: true});
})();
"""


def install(app: FastAPI) -> None:
    @app.get(PATH, include_in_schema=False)
    def tab_script() -> Response:
        return Response(SCRIPT, media_type="text/javascript", headers={"Cache-Control": "no-cache"})
