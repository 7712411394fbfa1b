"""How the page looks: Gradio's default theme with the system's fonts, and the page's CSS.

The CSS targets the components' elem_ids (webui/page/ui/sidebar.py, chat_panel.py,
chat_settings.py, server_tab.py) and the classes of a message's figures and controls
(webui/page/logic/rows.py, versions.py). webui/server.py hands both to Gradio when it mounts the
page. Nothing is fetched from elsewhere. Runs once, at start-up; no MLX.
"""

from __future__ import annotations

import gradio as gr

SYSTEM_FONTS = ["system-ui", "-apple-system", "Segoe UI", "Roboto", "Helvetica Neue", "Arial", "sans-serif"]
MONO_FONTS = ["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "Liberation Mono", "monospace"]

CSS = """
#conv-list .wrap { flex-direction: column; flex-wrap: nowrap; gap: 2px; }
#conv-list label { width: 100%; max-width: 100%; box-sizing: border-box; margin: 0; padding: 6px 10px;
  border: none; border-radius: 6px; background: transparent; box-shadow: none; }
/* a chat's title, or a search hit's title and matching text, in at most two lines */
#conv-list label span { overflow: hidden; overflow-wrap: anywhere; display: -webkit-box;
  -webkit-line-clamp: 2; -webkit-box-orient: vertical; }
#conv-list label:hover { background: var(--background-fill-primary); }
#conv-list label.selected { background: var(--background-fill-primary); font-weight: 600;
  box-shadow: inset 3px 0 0 var(--color-accent); }
#conv-list input[type=radio] { display: none; }
#compose { flex-wrap: nowrap; align-items: end; }
#compose #send { flex: 0 0 auto; min-width: 72px; }
#top-row { align-items: center; }
#chat button[aria-label="Clear"] { display: none; }
.rc-stats { font-size: 0.8em; opacity: 0.7; }
/* under a message: ‹ i/n › between its versions, and Edit; big enough to tap on a phone */
.rc-branch { display: inline-flex; align-items: center; gap: 2px; font-size: 0.85em; opacity: 0.8; }
.rc-branch a, .rc-branch .rc-off { padding: 2px 8px; text-decoration: none; }
.rc-branch .rc-off { opacity: 0.35; }
.rc-branch .rc-count { padding: 0 2px; font-variant-numeric: tabular-nums; }
#edit-bar { align-items: center; flex-wrap: nowrap; }
#again-row { flex-wrap: nowrap; }
/* a code block's copy button sits in its top right corner: the code starts below it */
#chat .code_wrap pre { padding-top: 34px !important; }
/* the Server tab's row names break between words, not inside them, on a phone */
:is(#server-summary, #your-usage) :is(th, td) { overflow-wrap: normal; word-break: normal; }
#side-about { display: none; }
/* a closed drawer's controls, off-screen, leave the tab order and what a screen reader reads
   (once it has slid out: visibility waits the slide's 0.3 s; opening shows them at once) */
#sidebar:not(.open) .sidebar-content { visibility: hidden; transition: visibility 0s linear 0.3s; }
/* a search that lists nothing says so: the box holds text and the list has no chat in it */
#search-none, #chats-none { display: none; }
#sidebar:has(#search :is(textarea, input):not(:placeholder-shown)):not(:has(#conv-list label)) #search-none
  { display: block; opacity: 0.75; }
#sidebar:has(#search :is(textarea, input):placeholder-shown):not(:has(#conv-list label)) #chats-none
  { display: block; opacity: 0.75; }
/* a phone: the header is one line (who and the model, cut short; all of it is in the drawer),
   room is left on the left for the drawer's button, and the message box and Send stay on
   screen under a shorter chat area, shorter still while an edit's bar is above the box */
@media (max-width: 768px) {
  #top-row { padding-left: 28px; flex-wrap: nowrap; gap: 8px; }
  #header { min-width: 0 !important; flex: 1 1 0; overflow: hidden !important; }
  #header p { white-space: nowrap; overflow: hidden; text-overflow: ellipsis; margin: 0; }
  #header br, #header p > em, #header p > em ~ * { display: none; }
  #header p { max-height: 1.6em; }
  #side-about { display: block; font-size: 0.85em; }
  #chat { height: max(160px, calc(100dvh - 310px)) !important; }
  :has(#edit-bar) #chat { height: max(120px, calc(100dvh - 380px)) !important; }
  #message textarea { max-height: 22dvh; }
}
"""


def theme() -> gr.themes.Base:
    """Gradio's default look with the system's fonts: nothing is fetched from elsewhere."""
    return gr.themes.Default(font=SYSTEM_FONTS, font_mono=MONO_FONTS)
