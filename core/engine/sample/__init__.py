"""Choosing each row's next token, engine thread only: per-request seeded samplers, the batch's
one sampling call, grammars enforced while sampling (llguidance) and their per-user cache.
"""
