"""The suite's statistics: paired rounds, median, min, spread, and a verdict.

A wall-clock figure is measured in rounds interleaved across the arms it compares (each
round runs every arm once, in an order rotated round to round), and is *paired*: the
ratio (or difference) is taken within each round, then summarised over the rounds, so
slow drifts of the machine's load cancel. An instruction count is measured twice, quiet
and beside a CPU-bound neighbour; its spread is the distance between the two.

Verdict (``verdict``): with the spread ``s`` (half the range of the per-round figures, or
the quiet/neighbour distance of a count), a figure whose median ``m`` is within ``s`` of
its target is "not decided"; otherwise "met" or "missed" by the side ``m`` is on.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

MET, MISSED, UNDECIDED = "met", "missed", "not decided"
#: A count that moves more than this between quiet and loaded runs is a defect of the code.
LOAD_TOLERANCE = 0.05


@dataclass(frozen=True)
class Summary:
    """One figure over its rounds."""

    median: float
    min: float
    max: float
    spread: float  # half the range of the rounds
    n: int
    values: tuple[float, ...]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        raise ValueError("no values to summarise")
    lo, hi = min(values), max(values)
    return Summary(statistics.median(values), lo, hi, (hi - lo) / 2, len(values),
                   tuple(values))


def paired(a: Sequence[float], b: Sequence[float],
           op: Callable[[float, float], float] = lambda x, y: x / y) -> Summary:
    """``op(a[i], b[i])`` round by round (default: the ratio), summarised."""
    if len(a) != len(b):
        raise ValueError(f"unpaired rounds: {len(a)} and {len(b)}")
    return summarize([op(x, y) for x, y in zip(a, b, strict=True)])


def verdict(median: float, spread: float, target: float | None,
            lower_is_better: bool = True) -> str:
    """met / missed / not decided (the spread reaches the target)."""
    if target is None:
        return "no target"
    if abs(median - target) <= spread:
        return UNDECIDED
    return MET if (median < target) == lower_is_better else MISSED


@dataclass(frozen=True)
class Count:
    """An instruction count, quiet and beside a CPU-bound neighbour."""

    quiet: float
    loaded: float | None

    @property
    def spread(self) -> float:
        return 0.0 if self.loaded is None else abs(self.loaded - self.quiet)

    @property
    def moved(self) -> float | None:
        """Relative change under load (None: not measured loaded)."""
        if self.loaded is None:
            return None
        return self.spread / abs(self.quiet) if self.quiet else 0.0

    @property
    def load_defect(self) -> bool:
        moved = self.moved
        return moved is not None and moved > LOAD_TOLERANCE

    def as_dict(self) -> dict[str, Any]:
        return {"quiet": self.quiet, "loaded": self.loaded, "moved": self.moved,
                "load_defect": self.load_defect}


def count_verdict(count: Count, target: float | None) -> str:
    """A count against its target: the quiet figure decides, the loaded one bounds it."""
    return verdict(count.quiet, count.spread, target)


def row(figure: str, target_text: str, measured: str, verdict_: str, *,
        short: str | None = None, **data: Any) -> dict[str, Any]:
    """One SPEC section 7 row as the report prints it, with its raw data kept beside it;
    ``short``: trainbus's figure for the top-level README's table (default: the first
    clause of ``measured``)."""
    return {"figure": figure, "target": target_text, "measured": measured,
            "verdict": verdict_, "short": short, "data": data}
