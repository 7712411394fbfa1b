"""The Gradio chat page: what it shows (`layout.py`), what its buttons do (`logic.py`), the
Server tab (`dashboard.py`), messages as text, code and links only (`markup.py`), the
Content-Security-Policy of every response (`csp.py`) and what a tab does once its sign-in
ended (`signed_out.py`). Runs on the server's event loop and Gradio's workers; no MLX."""
