"""The inference engine: one thread that owns the model and every MLX operation, and the seam
(`seam.py`, `requests.py`, `handle.py`) through which webui/ reaches it. Its modules and what
each holds are mapped in docs/DESIGN.md. Importing this package loads no MLX: only the engine
thread does, when it starts.
"""
