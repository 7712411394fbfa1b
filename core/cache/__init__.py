"""The shared radix prefix KV cache: here the token tree (no MLX), who may reuse what, its MLX
side and forgetting; in rooms, `batch/` the decoding batch's K/V buffers and `disk/` the
disk tier. Only the engine thread runs its MLX parts. docs/DESIGN.md maps every module.
"""
