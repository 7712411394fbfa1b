"""The controls inside a message: "‹ 1/2 ›" between versions of a message, and "Edit" on one's own.

A message edited and sent again, or answered again, has versions (siblings in the store's tree
of messages, core.store.Branch). Under a message with versions the chat area shows `‹ i/n ›`;
under each of the user's messages an "Edit". They are links to `#rc-show-<id>` (that version)
and `#rc-edit-<id>` inside a `<span class="rc-branch">` that webui/page/logic/rows.py appends to the
message after its text went through markup.shown, which leaves no tag of a message's own, so
no message can make one. Gradio's Chatbot draws messages as (sanitized) HTML and has no
per-message buttons of this kind: `LISTEN`, run once in the browser, catches a click on such a
link, keeps the page from following it, notes what it asked for and presses the hidden button
the page wires to `parse`'s caller. An id is only ever looked up for the signed-in user, in
the chat in view (the store's answer for anyone else's is "not found").

Gradio's copy button copies a message's content as given: Markdown made safe by markup.shown
(`<code>` tags, escapes), the figures and the controls. So rows.py ends a stored message with
`source`, its text as typed (base64 in an HTML comment, which the Chatbot does not show), and
`LISTEN` makes a copy of a message that ends so copy that text; one without it (a reply being
written) is copied up to its figures or controls. `LISTEN` also keeps the messages' labels for
screen readers to their words: Gradio labels a message with its whole content.

Pure functions and a script; any thread. No Gradio, no store.
"""

from __future__ import annotations

import base64
import re

SHOW, EDIT = "show", "edit"
_ACTION = re.compile(r"(show|edit)-(\d{1,18})")

# once per page: a click on a version or edit link asks the server, through the hidden button.
# A message's copy button copies its text as typed: Gradio copies the whole content it was
# given, through the clipboard API where the page is a secure context (localhost) and through
# a textarea and a copy event elsewhere (http on the LAN). Only the comment at the very end is
# read: one inside a message's code block is the message's own text, copied as such.
LISTEN = r"""() => {
  if (window.__rcVersions) return;
  window.__rcVersions = true;
  const source = /\n\n\x3c!--rc-src:([A-Za-z0-9+\/=]*)-->$/;
  const decoded = (t) => {
    const m = typeof t === 'string' ? t.match(source) : null;
    try {
      return m ? new TextDecoder().decode(Uint8Array.from(atob(m[1]), (c) => c.charCodeAt(0))) : null;
    } catch (e) {
      return null;  // not one of ours: copied up to its figures and controls
    }
  };
  const cut = (t) => {
    const at = t.search(/\n\n\x3c(span class="rc-(stats|branch)"|!--rc-src:)/);
    return at < 0 ? t : t.slice(0, at);
  };
  const strip = (t) => (typeof t === 'string' ? decoded(t) ?? cut(t) : t);
  if (navigator.clipboard && navigator.clipboard.writeText) {
    const write = navigator.clipboard.writeText.bind(navigator.clipboard);
    navigator.clipboard.writeText = (t) => write(strip(t));
  }
  document.addEventListener('copy', (e) => {
    const box = document.activeElement;
    if (box && box.tagName === 'TEXTAREA' && box.value !== strip(box.value)) {
      e.clipboardData.setData('text/plain', strip(box.value));
      e.preventDefault();
    }
  }, true);
  // a message's label for screen readers: its words as typed, not the markup around them
  const label = (el) => {
    const t = el.getAttribute('aria-label') || '';
    const words = decoded(t);
    const i = t.indexOf(': ');  // after "user's message: "
    const said = words === null ? cut(t) : (i < 0 ? '' : t.slice(0, i + 2)) + words;
    if (said !== t) el.setAttribute('aria-label', said);
  };
  new MutationObserver((changes) => {
    for (const c of changes) {
      if (c.type === 'attributes') label(c.target);
      else c.target.querySelectorAll?.('[aria-label*="rc-src:"], [aria-label*="rc-branch"], [aria-label*="rc-stats"]').forEach(label);
    }
  }).observe(document.body, {subtree: true, childList: true, attributes: true, attributeFilter: ['aria-label']});
  document.addEventListener('click', (e) => {
    const a = e.target.closest && e.target.closest('#chat .rc-branch a[href^="#rc-"]');
    if (!a) return;
    e.preventDefault();
    e.stopPropagation();
    window.__rcAsked = a.getAttribute('href').slice(4);
    document.querySelector('#versions-go')?.click();
  }, true);
}"""
ASKED = "() => window.__rcAsked || ''"  # what the last click asked for, read by the button's event


def controls(message_id: int, role: str, versions: tuple[int, ...], *, editable: bool) -> str:
    """The HTML appended under a message: `‹ i/n ›` when it has versions, "Edit" on a user's
    message when `editable`; "" when neither."""
    parts = []
    if len(versions) > 1 and message_id in versions:
        i, n = versions.index(message_id), len(versions)
        prev = (
            f'<a href="#rc-show-{versions[i - 1]}" title="Previous version">‹</a>'
            if i > 0
            else '<span class="rc-off">‹</span>'
        )
        nxt = (
            f'<a href="#rc-show-{versions[i + 1]}" title="Next version">›</a>'
            if i + 1 < n
            else '<span class="rc-off">›</span>'
        )
        parts.append(f'{prev}<span class="rc-count">{i + 1}/{n}</span>{nxt}')
    if editable and role == "user":
        parts.append(f'<a href="#rc-edit-{message_id}" title="Edit and send again">Edit</a>')
    return f'\n\n<span class="rc-branch">{"".join(parts)}</span>' if parts else ""


def source(text: str) -> str:
    """What ends a stored message's content: `text` as typed, for LISTEN to copy (base64, so
    that nothing in it can end the comment or read as Markdown)."""
    return f"\n\n<!--rc-src:{base64.b64encode(text.encode()).decode()}-->"


def parse(asked: object) -> tuple[str, int] | None:
    """("show" or "edit", message id) from what a click asked for; None for anything else."""
    m = _ACTION.fullmatch(asked) if isinstance(asked, str) else None
    return None if m is None else (m.group(1), int(m.group(2)))
