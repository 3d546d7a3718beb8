"""(e) A metrics upload per batch to a local server answering after 20 ms (its own
process), wall clock, ratio to the plain loop POSTing inline, paired round by round:

- the same work as the peers: one POST per batch, awaited, from an ``async def batch_end``
  (trainbus) or a plain hook (the others);
- ``HTTPMetricsUploader`` logging the loss every batch (batched, retried, flushed at close,
  inside the timed epoch): the target's row.
"""

from __future__ import annotations

from typing import Any

from harness import stats
from harness.runner import Context, latency_server

from suite import _wall

FIGURE = "(e) a metrics upload per batch to a local 20 ms server"
TARGET = 0.10


def run(ctx: Context) -> list[dict[str, Any]]:
    base = ("plain", "upload", 1)
    same = ("trainbus_fw", "upload", 1)
    uploader = ("trainbus_fw", "uploader", 1)
    arms = [base, same, uploader, *_wall.peer_arms(ctx, "upload", 1)]
    with latency_server(20) as url:
        times = ctx.interleaved(arms, workload="mlp", batches=50 if ctx.quick else 200,
                                reps=1, url=url)
    labels = {same: "trainbus (one awaited POST from an async def)",
              uploader: "trainbus HTTPMetricsUploader"}
    cells, data = _wall.ratio_cells(ctx, times, base, arms[1:], labels)
    s = stats.paired(times[uploader], times[base])
    return [stats.row(FIGURE + " (ratio to the plain loop posting inline)",
                      f"HTTPMetricsUploader <= {TARGET:.2f}x",
                      "; ".join(cells + _wall.missing_peers(ctx)),
                      stats.verdict(s.median, s.spread, TARGET), unit="ratio",
                      short=f"HTTPMetricsUploader {s.median:.2f}x ({s.min:.2f}-{s.max:.2f})",
                      **data)]
