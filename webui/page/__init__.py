"""The Gradio chat page: what it shows (`layout.py`), what its buttons do (`logic.py`) and
the Server tab (`dashboard.py`). Runs on the server's event loop and Gradio's workers; no MLX."""
