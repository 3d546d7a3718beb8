"""Paired differences or ratios, read with a distribution-free confidence interval of the median.

Shared by ``bench_dashboard.py`` (ratios per round against +2%), ``windows.py`` and the
windowed benchmarks (per ABBA block: ``bench_mlflow_windows.py`` against +0.1 ms/batch,
``bench_dashboard_windows.py`` against +2%, ``bench_trailing_windows.py``): the spread
(min, p25, median, p75, max), the interval (order statistics of the binomial, no
assumption on the distribution), and the verdict on a target.
"""

from __future__ import annotations

import math
import statistics

__all__ = ["median_interval", "spread", "verdict"]


def spread(xs: list[float], fmt: str = ".3f") -> str:
    """``min | p25 | median | p75 | max``."""
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return " | ".join(f"{x:{fmt}}" for x in (min(xs), q[0], statistics.median(xs), q[2], max(xs)))


def median_interval(xs: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free confidence interval of the median: the k-th smallest and k-th
    largest values, k the largest with P(Binomial(n, 1/2) < k) <= (1 - level) / 2 (``None``
    with too few values: under 6 for 95%)."""
    ys, n = sorted(xs), len(xs)
    k = 0
    while k < n // 2 and sum(math.comb(n, i) for i in range(k + 1)) / 2**n <= (1 - level) / 2:
        k += 1
    return (ys[k - 1], ys[n - k]) if k > 0 else None


def verdict(interval: tuple[float, float] | None, target: float, what: str = "rounds") -> str:
    """An upper bound ``target`` on the median against its confidence interval: *shown*
    when the interval's top is at most ``target``, *refuted* when its bottom is above it,
    *not decided* otherwise (*too few* ``what`` without an interval)."""
    if interval is None:
        return f"too few {what}"
    low, high = interval
    if high <= target:
        return "shown"
    if low > target:
        return "refuted"
    return "not decided"
