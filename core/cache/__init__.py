"""The shared radix prefix KV cache.

`radix.py` is the token tree, its locks, byte budget and eviction (pure Python, no MLX,
testable without a model); `kv.py` is its MLX side (K/V segments, snapshots of
non-trimmable layers, the `PrefixStore` the engine calls); `disk.py` its disk tier
(`diskio.py` the files and their I/O threads, `identity.py` the model fingerprint that keys
them); `warm.py` the prompts prefilled at start-up; `offset_guard.py` checks and
repairs mlx-lm's batched caches' offset semantics at start-up. Only the engine thread runs
`kv.py`, `disk.py` and `offset_guard.py`.
"""
