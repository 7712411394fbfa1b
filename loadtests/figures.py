"""Figures the benchmark scripts print: percentiles over a run's measurements. Pure Python."""

from __future__ import annotations


def pct(xs, q: float) -> float:
    """The q-quantile (0..1) of xs, nearest rank; NaN for no measurements."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")
