"""(c) 100 no-op callbacks on every per-batch hook, wall clock, ratio to the plain loop with
no callbacks, paired round by round (MLP workload). trainbus plain (the target's row) and
``async def``."""

from __future__ import annotations

from typing import Any

from harness import stats
from harness.runner import Context

from suite import _wall

FIGURE = "(c) 100 no-op callbacks (wall, ratio to the plain loop)"
TARGET = 2.5


def run(ctx: Context) -> list[dict[str, Any]]:
    base = ("plain", "noop", 0)
    tb, tb_async = ("trainbus_fw", "noop", 100), ("trainbus_fw", "noop-async", 100)
    arms = [base, tb, tb_async, *_wall.peer_arms(ctx, "noop", 100)]
    times = ctx.interleaved(arms, workload="mlp", batches=30 if ctx.quick else 100, reps=1)
    labels = {tb: "trainbus", tb_async: "trainbus async def"}
    cells, data = _wall.ratio_cells(ctx, times, base, arms[1:], labels)
    s = stats.paired(times[tb], times[base])
    return [stats.row(FIGURE, f"<= {TARGET:.1f}x", "; ".join(cells + _wall.missing_peers(ctx)),
                      stats.verdict(s.median, s.spread, TARGET), unit="ratio", **data)]
