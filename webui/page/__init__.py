"""The Gradio chat page. What it shows: `layout.py` (the page, part by part: `sidebar.py`,
`chat_panel.py`, `chat_settings.py`, `server_tab.py`; the look in `style.py`, the browser's
scripts in `scripts.py`), which event calls what (`wiring.py`), and what the events do
(`handlers.py`, `sending.py`, over `view.py`). What the buttons do to the chats, without the
page: `logic.py` (`chats.py`, `replies.py`, `rows.py`, `errors.py`). The Server tab's figures
(`dashboard.py`), the model's card in words (`model_card.py`), messages as text, code and
links only (`markup.py`), the versions of a message (`versions.py`), the Content-Security-Policy
of every response (`csp.py`), a shared chat's read-only page (`shared.py`) and what a tab does
once its sign-in ended (`signed_out.py`). Runs on the server's event loop and Gradio's
workers; no MLX."""
