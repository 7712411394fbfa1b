"""The OpenAI-compatible HTTP API: routes (`routes.py`), request and response shapes
(`schema.py`), errors in OpenAI's shape (`errors.py`) and Prometheus metrics (`metrics.py`).
Runs on the server's event loop and its worker threads; no MLX."""
