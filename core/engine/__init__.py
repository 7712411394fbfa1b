"""The inference engine: one thread that owns the model and every MLX operation.

`engine.py` (the thread, admission, batching, the prefix cache's use), `handle.py` (the
caller's side of a request), `requests.py` (request and event types, no MLX), `sampling.py`
(per-request seeded samplers), `textstream.py` (detokenizing, stop strings), `model.py`
(loading). Importing this package loads no MLX: only the engine thread does, when it starts.
"""
