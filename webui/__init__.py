"""The web side: the API, the page, sign-in, the CLI. No MLX (tests/test_packaging.py).

Importing it first makes gradio's later import skip rewriting its own stubs
(webui/gradio_import.py)."""

from radixchat.webui import gradio_import

gradio_import.install()
