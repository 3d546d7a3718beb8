"""Paired windows inside one run: a cost measured against its own neighbours.

On a shared machine the same figure moves by 2-5x between runs, and fresh runs paired
round by round still spread more than a 0.1 ms or 2% target. A finer pairing: one long run
whose batches are cut into windows of ``width`` batches, the thing measured switched on and
off window by window in ``ABBA`` blocks (on, off, off, on) or ``BAAB`` ones, drawn at random
(:func:`schedule`): each block's difference ``(on1 + on2) / 2 - (off1 + off2) / 2`` cancels
any drift of the machine that is linear over the block's few seconds. The blocks' differences are then summarised by their median and a
distribution-free 95% confidence interval of it, and a target is *shown* when the interval
lies under it, *refuted* when it lies over it, and *not decided* otherwise
(``paired_stats.py``).

An A/A control (both halves of every block off) shows the method's own noise: its interval
should hold 0.

The first ``settle`` batches of every window are left out of its mean (what the previous
window left running: trailing handlers, deferred records, a page loading); the figures are
given without leaving anything out too.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from paired_stats import median_interval, spread

__all__ = [
    "ABBA",
    "BAAB",
    "Summary",
    "block_differences",
    "is_on",
    "schedule",
    "summarize",
    "window_means",
]

#: The "on" windows of a block of four: ``ABBA``, or ``BAAB`` (the same pairing, mirrored).
ABBA = (True, False, False, True)
BAAB = (False, True, True, False)


def schedule(blocks: int, seed: int | None = None) -> list[bool]:
    """Whether each window is "on": ``ABBA`` blocks, or with ``seed`` each block ``ABBA``
    or ``BAAB`` drawn at random, so that no position in a block (the ends, the middle)
    is always "on" (an A/A control in strict ``ABBA`` order sat off zero here)."""
    rng = random.Random(seed)
    out: list[bool] = []
    for _ in range(blocks):
        out += ABBA if seed is None or rng.random() < 0.5 else BAAB
    return out


def is_on(batch_index: int, width: int, on: Sequence[bool] | None = None) -> bool:
    """Whether the 0-based ``batch_index`` falls in an "on" window of ``on`` (a
    :func:`schedule`; strict ``ABBA`` blocks without one)."""
    window = batch_index // width
    if on is None:
        return ABBA[window % 4]
    return window < len(on) and on[window]


def window_means(per_batch: Sequence[float], width: int, settle: int) -> list[float]:
    """Mean of ``per_batch`` over each whole window, its first ``settle`` batches left out."""
    if not 0 <= settle < width:
        raise ValueError(f"settle must be in [0, width), got {settle} for width {width}")
    means = []
    for start in range(0, len(per_batch) - width + 1, width):
        kept = per_batch[start + settle:start + width]
        means.append(sum(kept) / len(kept))
    return means


def block_differences(means: Sequence[float], on: Sequence[bool] | None = None) -> list[float]:
    """``(on + on) / 2 - (off + off) / 2`` for each whole block of window means (``on``: a
    :func:`schedule`; strict ``ABBA`` blocks without one)."""
    out = []
    for i in range(0, len(means) - 3, 4):
        flags = ABBA if on is None else on[i:i + 4]
        ons = [m for m, f in zip(means[i:i + 4], flags, strict=True) if f]
        offs = [m for m, f in zip(means[i:i + 4], flags, strict=True) if not f]
        out.append(sum(ons) / 2 - sum(offs) / 2)
    return out


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
                   median_interval(list(differences)), spread(list(differences), "+.3f"))
