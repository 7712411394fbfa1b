"""Test-cost settings: scrypt cheap enough that a test can add users by the dozen."""

from __future__ import annotations


def cheap_scrypt():
    """scrypt at a test cost: the real default takes ~0.4 s a hash (core.store.auth)."""
    from radixchat.core.store import auth

    return auth.ScryptCost(n=2**8, r=8, p=1)
