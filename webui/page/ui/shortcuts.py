"""The page's JavaScript for typing: drafts kept in the browser, the keyboard's shortcuts, and
the pace at which a visible tab asks the server what changed elsewhere.

Drafts: the message box's text is kept in localStorage per user (under the user's browser
key, which the page's load puts in the hidden `browser-key` box, as the chat settings are,
webui/page/ui/scripts.py) and per conversation ("new" for a new chat), saved as it changes, put
back when that chat comes into view again or the page loads, and dropped once the server
empties the box after a send (a refused send keeps the box, so its draft). Another user
signing in to the same browser reads other keys, and so does a new user given the name of a
removed one (the store never hands a browser key out twice); nothing is kept before the load
has said whose page it is.

Keys: Esc stops the reply being written in the chat in view (the button reads Stop), unless
the focus is in a dialog or in another field; Ctrl+Shift+O (Cmd+Shift+O on a Mac) opens a new
chat from anywhere, as ChatGPT's does; Up in the empty message box edits one's last message
(its "Edit", webui/page/logic/versions.py).

Syncing: while the tab is visible it presses the sidebar's hidden `sync-go` every SYNC_S and
at once when it comes back into view; the server answers only with what changed
(webui/page/events/sync.py). webui/page/events/wiring.py attaches all of these to events (Gradio's `js=`).
They run in the browser; this module only holds their text.
"""

from __future__ import annotations

SYNC_S = 4.0  # how often a visible tab asks for changes made elsewhere
NEW_CHAT_KEYS = "Ctrl+Shift+O"

# the draft's key for the user's browser key (`who`, "" until the page's load set it) and the
# chat in view (`current`, null: a new chat); "" while there is no user to keep it for
_DRAFT_KEY = """const key = who ? 'radixchat.draft.' + who + '.' + (current == null ? 'new' : current) : '';"""

# on the box's every `change` (Gradio's `input` misses a paste): what the box holds is the
# draft of the chat in view, whoever set it (typed, pasted, or an Edit's text). The box emptied
# under another key than the text it held (a send that made a new chat: `current` moved with
# it) drops that text where it was kept too; a refused send leaves the box, so its draft
KEEP_DRAFT = f"""(who, current, text) => {{ {_DRAFT_KEY}
  if (!key) return [];
  const kept = window.__rcKept;
  window.__rcKept = {{key, text}};
  try {{
    if (text) return localStorage.setItem(key, text), [];
    localStorage.removeItem(key);
    if (kept && kept.key !== key && kept.text && localStorage.getItem(kept.key) === kept.text)
      localStorage.removeItem(kept.key);
  }} catch (e) {{}}
  return [];
}}"""


def show_draft(*, replace: bool) -> str:
    """The draft of the chat now in view, for the message box. `replace`: a view change, where
    the box shows that chat's draft or nothing; else (the page loaded) a box already typed in
    keeps its text."""
    keep = "" if replace else "if (text) return text;"
    return f"""(who, current, text) => {{ {_DRAFT_KEY} {keep}
  let draft = '';
  try {{ if (key) draft = localStorage.getItem(key) || ''; }} catch (e) {{}}
  window.__rcKept = {{key, text: draft}};  // what the box is about to hold, and where it is kept
  return draft;
}}"""


# once per page. A key acts only where it surprises nobody: not in a dialog, and Esc and Up
# only from the message box or outside any field (Up only in an empty box, where it would
# move nothing)
KEYS = f"""() => {{
  if (window.__rcKeys) return [];
  window.__rcKeys = true;
  const newChat = document.querySelector('#new-chat');
  if (newChat) newChat.title = 'New chat ({NEW_CHAT_KEYS})';
  document.addEventListener('keydown', (e) => {{
    if (e.defaultPrevented || e.isComposing) return;
    const t = e.target instanceof Element ? e.target : null;
    const box = document.querySelector('#message textarea');
    const mod = e.ctrlKey || e.metaKey || e.altKey || e.shiftKey;
    if ((e.ctrlKey || e.metaKey) && e.shiftKey && !e.altKey && (e.key || '').toLowerCase() === 'o') {{
      e.preventDefault();
      document.querySelector('#new-chat')?.click();
      return;
    }}
    if (t && t.closest('dialog, [role=dialog], [aria-modal=true]')) return;
    const field = t && t !== box && t.closest('input, textarea, select, [contenteditable=""], [contenteditable=true]');
    if (e.key === 'Escape' && !mod && !field) {{
      const send = document.querySelector('#send');
      if (send && send.innerText.trim() === 'Stop') {{
        e.preventDefault();
        send.click();
      }}
    }} else if (e.key === 'ArrowUp' && !mod && box && t === box && box.value === '') {{
      const edits = document.querySelectorAll('#chat .rc-branch a[href^="#rc-edit-"]');
      if (edits.length) {{
        e.preventDefault();
        edits[edits.length - 1].click();
      }}
    }}
  }});
  return [];
}}"""

# once per page: ask for what changed elsewhere while the tab is visible (a hidden tab asks
# nothing; it asks at once when it is shown again)
SYNC = f"""() => {{
  if (window.__rcSync) return [];
  window.__rcSync = true;
  const ask = () => {{ if (document.visibilityState === 'visible') document.querySelector('#sync-go')?.click(); }};
  setInterval(ask, {int(SYNC_S * 1000)});
  document.addEventListener('visibilitychange', ask);
  return [];
}}"""
