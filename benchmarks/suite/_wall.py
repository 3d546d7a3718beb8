"""What the wall-clock rows share: the arms of the frameworks that run here, paired ratios."""

from __future__ import annotations

from typing import Any

from harness import stats
from harness.runner import LABELS, PEERS, Context


def ratio_cells(ctx: Context, times: dict[tuple[str, str, int], list[float]],
                base: tuple[str, str, int], arms: list[tuple[str, str, int]],
                labels: dict[tuple[str, str, int], str] | None = None
                ) -> tuple[list[str], dict[str, Any]]:
    """``label median x (min-max)`` per arm, each paired round by round with ``base``."""
    cells, data = [], {}
    for arm in arms:
        s = stats.paired(times[arm], times[base])
        label = (labels or {}).get(arm, LABELS[arm[0]])
        cells.append(f"{label} {s.median:.2f}x ({s.min:.2f}-{s.max:.2f})")
        data[label] = {"ratio": s.as_dict(), "ms_per_batch": times[arm]}
    data["base_ms_per_batch"] = times[base]
    return cells, data


def missing_peers(ctx: Context) -> list[str]:
    return [f"{LABELS[a]}: {reason}" for a in PEERS if (reason := ctx.missing(a))]


def peer_arms(ctx: Context, scenario: str, n: int) -> list[tuple[str, str, int]]:
    return [(a, scenario, n) for a in ctx.peers()]
