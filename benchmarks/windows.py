"""Paired windows inside one run: a cost measured against its own neighbours.

On a shared machine the same figure moves by 2-5x between runs, and fresh runs paired
round by round still spread more than a 0.1 ms or 2% target. A finer pairing: one long run
whose batches are cut into windows of ``width`` batches, the thing measured switched on and
off window by window in ``ABBA`` blocks (on, off, off, on): each block's difference
``(on1 + on2) / 2 - (off1 + off2) / 2`` cancels any drift of the machine that is linear over
the block's few seconds. The blocks' differences are then summarised by their median and a
distribution-free 95% confidence interval of it (order statistics of the binomial), and a
target is *shown* when the interval lies under it, *refuted* when it lies over it, and *not
decided* otherwise.

An A/A control (both halves of every block off) shows the method's own noise: its interval
should hold 0.

The first ``settle`` batches of every window are left out of its mean (what the previous
window left running: trailing handlers, deferred records, a page loading); the figures are
given without leaving anything out too.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "Summary",
    "block_differences",
    "is_on",
    "median_interval",
    "spread",
    "summarize",
    "verdict",
    "window_means",
]

#: Positions of the "on" windows in a block of four (ABBA).
_ON = (0, 3)


def is_on(batch_index: int, width: int) -> bool:
    """Whether the 0-based ``batch_index`` falls in an "on" window (ABBA blocks)."""
    return (batch_index // width) % 4 in _ON


def window_means(per_batch: Sequence[float], width: int, settle: int) -> list[float]:
    """Mean of ``per_batch`` over each whole window, its first ``settle`` batches left out."""
    if not 0 <= settle < width:
        raise ValueError(f"settle must be in [0, width), got {settle} for width {width}")
    means = []
    for start in range(0, len(per_batch) - width + 1, width):
        kept = per_batch[start + settle:start + width]
        means.append(sum(kept) / len(kept))
    return means


def block_differences(means: Sequence[float]) -> list[float]:
    """``(on + on) / 2 - (off + off) / 2`` for each whole ABBA block of window means."""
    return [
        (means[i] + means[i + 3]) / 2 - (means[i + 1] + means[i + 2]) / 2
        for i in range(0, len(means) - 3, 4)
    ]


def median_interval(xs: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free confidence interval of the median: the k-th smallest and k-th
    largest values, k the largest with P(Binomial(n, 1/2) < k) <= (1 - level) / 2
    (``None`` with too few values: under 6 for 95%)."""
    ys, n = sorted(xs), len(xs)
    k = 0
    while k < n // 2 and sum(math.comb(n, i) for i in range(k + 1)) / 2**n <= (1 - level) / 2:
        k += 1
    return (ys[k - 1], ys[n - k]) if k > 0 else None


def verdict(interval: tuple[float, float] | None, target: float) -> str:
    """A cost's median against ``target`` (at most): shown, refuted or not decided."""
    if interval is None:
        return "too few blocks"
    low, high = interval
    if high <= target:
        return "shown"
    if low > target:
        return "refuted"
    return "not decided"


def spread(xs: Sequence[float], fmt: str = ".3f") -> str:
    """``min | p25 | median | p75 | max``."""
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return " | ".join(f"{x:{fmt}}" for x in (min(xs), q[0], statistics.median(xs), q[2], max(xs)))


@dataclass(frozen=True)
class Summary:
    """The blocks' differences of one measure, summarised."""

    n: int
    median: float
    interval: tuple[float, float] | None
    spread: str

    def line(self, unit: str = "ms", fmt: str = "+.3f") -> str:
        ci = ("-" if self.interval is None
              else f"{self.interval[0]:{fmt}} .. {self.interval[1]:{fmt}}")
        return (f"median {self.median:{fmt}} {unit} (95% CI {ci}; "
                f"min | p25 | median | p75 | max: {self.spread}; {self.n} blocks)")


def summarize(differences: Sequence[float]) -> Summary:
    """Median, its 95% interval and the spread of blocks' differences."""
    if not differences:
        raise ValueError("no whole ABBA block: run more batches or narrower windows")
    return Summary(len(differences), statistics.median(differences),
                   median_interval(differences), spread(differences, "+.3f"))
