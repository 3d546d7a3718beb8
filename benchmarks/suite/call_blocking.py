"""``@blocking`` handler call, training thread: instructions per no-op call, 10 callbacks.

Every framework fits the tiny workload with 10 no-op callbacks on its per-batch hooks and
with none; per call = the difference per batch / handler calls per batch. Target: at most
Ignite's per-call count, measured in the same run (SPEC's 3,705 when Ignite is missing).
"""

from __future__ import annotations

from typing import Any

from harness import stats
from harness.runner import Context

from suite import _calls

FIGURE = "`@blocking` call (training thread)"


def counts(quick: bool) -> dict[str, list[dict[str, Any]]]:
    return _calls.plan(quick, "noop-blocking")


def run(ctx: Context) -> list[dict[str, Any]]:
    c = _calls.per_call(ctx, "trainbus_fw", "noop-blocking", 10, ctx.quick, all_threads=False)
    ignite = _calls.ignite_call(ctx, ctx.quick)
    target = ignite.quiet if ignite else 3705.0
    spread = c.spread + (ignite.spread if ignite else 0.0)
    peers, data = _calls.peers_cell(ctx, ctx.quick, all_threads=False)
    return [stats.row(
        FIGURE, f"<= Ignite's ({target:,.0f})",
        f"trainbus {_calls.fmt(c)}{_calls.defect_note(c)}. {peers}",
        stats.verdict(c.quiet, spread, target), unit="instructions per call",
        trainbus=c.as_dict(), peers=data, target=target)]
