"""The OpenAI-compatible HTTP API. Routers per concern: `models.py`, `chat.py` (chat
completions and completions), `responses.py` (the Responses API), put on the app by
`routes.py` (the 404 of unknown /v1 paths last); their shared state and the current user
come through FastAPI dependencies (`deps.py`); one path through the engine for all of
them (`generation.py`: submit, wait, stream). Request fields' one rule (`fields.py`),
request bodies (`schema.py`, `responses_shapes.py`), reply bodies (`replies.py`), tool
calls in replies (`toolcalls.py`), errors in OpenAI's shape (`errors.py`), Prometheus
metrics (`metrics.py`). Runs on the server's event loop and its worker threads; no MLX."""
