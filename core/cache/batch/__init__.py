"""The decoding batch's K/V: buffers with room to spare, what they take in memory, and the
offset semantics of mlx-lm's batched caches checked at start-up. Engine thread only.
"""
