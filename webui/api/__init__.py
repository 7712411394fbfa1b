"""The OpenAI-compatible HTTP API (and Anthropic's Messages API): routers per concern put on
the app by `routes.py`, their shared state and the current user as FastAPI dependencies, one
path through the engine for all of them (`generation.py`); request and reply bodies and the
one rule for request fields in `shapes/`. Runs on the server's event loop and its worker
threads; no MLX. docs/DESIGN.md maps every module."""
