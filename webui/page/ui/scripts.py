"""The few lines of JavaScript the page runs in the browser: the sidebar opened beside the chat
on a wide screen and closed on a phone, a pick or "New chat" in view at once (a new chat with
the first model picked), an edited message's box brought into view, the temperature and max
tokens kept per user in the browser (localStorage, under the user's browser key) across reloads, and an export saved as a
file. Drafts, the keyboard's shortcuts and a tab's sync are webui/page/ui/shortcuts.py's.

webui/page/events/wiring.py attaches them to events (Gradio's `js=`); the controls inside a message
have their own script (webui/page/logic/versions.py). They run in the browser; this module only
holds their text.
"""

from __future__ import annotations

import json

from radixchat.webui.page.events.view import NO_PROMPT

# the browser saves an export handed to it as {name, type, text}; "" is nothing to save
SAVE = """(payload) => {
  if (!payload) return [];
  const file = JSON.parse(payload);
  const url = URL.createObjectURL(new Blob([file.text], {type: file.type}));
  const a = document.createElement("a");
  a.href = url;
  a.download = file.name;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
  return [];
}"""
# Gradio's sidebar is a drawer over the whole page at this width and less (its own CSS)
DRAWER_PX = 768
_DRAWER = f"""const s = document.querySelector('#sidebar');
  const open = !!s && s.classList.contains('open');
  const want = window.innerWidth > {DRAWER_PX};"""
# beside the chat on a wide screen; on a phone a drawer that starts closed
OPEN_WIDE = f"() => {{ {_DRAWER} if (s && open !== want) s.querySelector('.toggle-button').click(); }}"
_CLOSE_ON_PHONE = f"{{ {_DRAWER} if (open && !want) s.querySelector('.toggle-button').click(); }}"
# after Edit under a message: its text is in the box, which comes into view with the caret at
# its end (on a phone the box may be under the fold; the chat keeps its place)
EDITING = """() => {
  const box = document.querySelector('#message textarea');
  if (!box || !document.querySelector('#edit-bar')) return [];
  box.scrollIntoView({block: 'nearest'});
  box.focus({preventScroll: true});
  box.setSelectionRange(box.value.length, box.value.length);
  return [];
}"""
# the header's words, also in the drawer, where a phone shows them in full
ABOUT = "(words) => words"
# temperature and max tokens, kept in this browser per user (under their browser key, `who`,
# which the page's load sets: never a name, which a later user may be given), so a reload
# keeps them; what is kept is checked to be two numbers, else the page's own values stay
_KEY = """const key = who ? 'radixchat.settings.' + who : '';"""
RESTORE_SETTINGS = f"""(who, temperature, max_tokens) => {{ {_KEY}
  if (key) try {{
    const kept = JSON.parse(localStorage.getItem(key) || 'null');
    if (kept && Number.isFinite(kept.temperature) && Number.isFinite(kept.max_tokens))
      return [kept.temperature, kept.max_tokens];
  }} catch (e) {{ /* nothing usable kept */ }}
  return [temperature, max_tokens];
}}"""
KEEP_SETTINGS = f"""(who, temperature, max_tokens) => {{ {_KEY}
  if (key && Number.isFinite(temperature) && Number.isFinite(max_tokens))
    try {{ localStorage.setItem(key, JSON.stringify({{temperature, max_tokens}})); }} catch (e) {{}}
  return [];
}}"""
PICK = f"(picked, n) => {{ {_CLOSE_ON_PHONE} return [picked, (n || 0) + 1]; }}"


def new_chat(first_model: str) -> str:
    """In the browser, at once: a new chat is in view (current None) with `first_model` picked,
    so a message sent right away makes its chat with it; the next view change is counted."""
    return f"""(n) => {{ {_CLOSE_ON_PHONE}
  document.querySelector('#message textarea')?.focus();
  return [null, null, [], "", "", "{NO_PROMPT}", "", (n || 0) + 1, {json.dumps(first_model)}]; }}"""
