"""One server over an mlx.launch group: the group and its messages, rank 0's record of what
changed, and the engine of every other rank, which replays it and steps in lockstep.
"""
