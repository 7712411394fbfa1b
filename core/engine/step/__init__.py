"""One step of the model, engine thread only: the budgeted step over mlx-lm's BatchGenerator,
the decoding batch, the generator interface, speculative drafts, and the CPU's faster kernels.
"""
