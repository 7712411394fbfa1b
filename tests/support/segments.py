"""Simulated cache segments for the radix tree alone, without a model: `SimSeg` remembers which
tokens it covers and weighs BPT bytes a token."""

from __future__ import annotations

BPT = 10  # simulated bytes per token


class SimSeg:
    """A simulated segment: remembers which tokens of which sequence it covers."""

    def __init__(self, tokens):
        self.tokens = tuple(tokens)
        self.nbytes = BPT * len(self.tokens)

    def split(self, k):
        return SimSeg(self.tokens[:k]), SimSeg(self.tokens[k:])
