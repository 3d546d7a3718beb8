"""Plain (``def``) handler call: instructions per no-op call on the training thread and on
all threads (the callback's own thread, the loop), 10 callbacks, as ``call_blocking``."""

from __future__ import annotations

from typing import Any

from harness import stats
from harness.runner import Context

from suite import _calls

FIGURE = "plain call, training thread"
FIGURE_ALL = "plain call, all threads"
TRAIN_TARGET, ALL_TARGET = 2000.0, 7400.0
KIND = "noop"


def counts(quick: bool) -> dict[str, list[dict[str, Any]]]:
    return _calls.plan(quick, KIND)


def rows(ctx: Context, kind: str, figures: tuple[str, str],
         targets: tuple[float, float], all_text: str) -> list[dict[str, Any]]:
    out = []
    for all_threads, figure, target in ((False, figures[0], targets[0]),
                                        (True, figures[1], targets[1])):
        c = _calls.per_call(ctx, "trainbus_fw", kind, 10, ctx.quick, all_threads)
        peers, data = _calls.peers_cell(ctx, ctx.quick, all_threads)
        target_text = f"<= {target:,.0f}" + (f" ({all_text})" if all_threads else "")
        out.append(stats.row(
            figure, target_text, f"trainbus {_calls.fmt(c)}{_calls.defect_note(c)}. {peers}",
            stats.count_verdict(c, target), unit="instructions per call",
            trainbus=c.as_dict(), peers=data, target=target))
    return out


def run(ctx: Context) -> list[dict[str, Any]]:
    return rows(ctx, KIND, (FIGURE, FIGURE_ALL), (TRAIN_TARGET, ALL_TARGET), "2x Ignite")
