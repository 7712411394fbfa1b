"""Scheduling policy, engine thread only: the fair queue by user, which waiting requests join
the batch, each user's requests in flight, and what pauses when room or a step's share runs
out (preemption, grammar masks paid from their owner's share). No MLX.
"""
