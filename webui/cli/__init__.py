"""The composition root: the `radixchat` command, which builds the engines and the app and
serves them (`main.py`), asks a running server (`ask.py`) and administers the store
(`admin.py`). The only room of webui/ that may import the engine itself."""
