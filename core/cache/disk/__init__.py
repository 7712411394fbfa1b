"""The prefix cache's disk tier: nodes whose K/V lives in files, read back on demand, kept to a
limit from the free space, found again by the next start (keyed by the model's fingerprint).
Its I/O runs on two threads of its own; the rest on the engine thread.
"""
