"""(d) 4 callbacks each sleeping 5 ms (``time.sleep``) at ``BATCH_END``, over a plain loop
sleeping 5 ms once a batch: wall clock, ratio paired round by round (MLP workload)."""

from __future__ import annotations

from typing import Any

from harness import stats
from harness.runner import Context

from suite import _wall

FIGURE = "(d) 4 callbacks sleeping 5 ms at `BATCH_END`, over a plain loop sleeping 5 ms"
TARGET = 1.10


def run(ctx: Context) -> list[dict[str, Any]]:
    base = ("plain", "sleep", 1)
    tb = ("trainbus_fw", "sleep", 4)
    arms = [base, tb, *_wall.peer_arms(ctx, "sleep", 4)]
    times = ctx.interleaved(arms, workload="mlp", batches=30 if ctx.quick else 100, reps=1)
    cells, data = _wall.ratio_cells(ctx, times, base, arms[1:])
    s = stats.paired(times[tb], times[base])
    return [stats.row(FIGURE, f"<= {TARGET:.2f}x", "; ".join(cells + _wall.missing_peers(ctx)),
                      stats.verdict(s.median, s.spread, TARGET), unit="ratio", **data)]
