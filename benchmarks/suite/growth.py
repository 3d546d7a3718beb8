"""Growth from 1 to 1,000 no-op callbacks: instructions per handler call (all threads) at
1 and at 1,000, trainbus plain and ``async def``, Ignite, the plain loop. Target: linear,
a per-call cost that stays flat: the ratio r of the two, as max(r, 1/r), at most 1.25."""

from __future__ import annotations

from typing import Any

from harness import stats
from harness.runner import LABELS, Context
from harness.stats import Count

from suite import _calls

FIGURE = "growth, 1 to 1,000 callbacks"
ARMS = (("trainbus_fw", "noop"), ("trainbus_fw", "noop-async"), ("ignite_fw", "noop"),
        ("plain", "noop"))


def big_batches(quick: bool) -> list[int]:
    return [1, 2] if quick else [2, 4]


def counts(quick: bool) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for adapter, kind in ARMS:
        out.setdefault(adapter, [_calls.config("noop", 0, quick)])
        out[adapter] += [_calls.config(kind, 1, quick),
                         _calls.config(kind, 1000, quick, big_batches(quick))]
    return out


def flatness(one: Count, many: Count) -> Count:
    def f(a: float, b: float) -> float:
        r = b / a
        return max(r, 1 / r)

    loaded = None if one.loaded is None or many.loaded is None else f(one.loaded, many.loaded)
    return Count(f(one.quiet, many.quiet), loaded)


def run(ctx: Context) -> list[dict[str, Any]]:
    cells, data, verdicts = [], {}, []
    for adapter, kind in ARMS:
        label = LABELS[adapter] + ("" if adapter != "trainbus_fw" else f" {kind}")
        if reason := ctx.count_reason(adapter):
            cells.append(f"{label}: {reason}")
            continue
        one = _calls.per_call(ctx, adapter, kind, 1, ctx.quick, True)
        many = _calls.per_call(ctx, adapter, kind, 1000, ctx.quick, True, big_batches(ctx.quick))
        flat = flatness(one, many)
        cells.append(f"{label} {one.quiet:,.0f} -> {many.quiet:,.0f} a call"
                     f"{_calls.defect_note(one, many)}")
        data[f"{adapter}:{kind}"] = {"one": one.as_dict(), "thousand": many.as_dict(),
                                     "flatness": flat.as_dict()}
        if adapter == "trainbus_fw":
            verdicts.append(stats.count_verdict(flat, 1.25))
    verdict = (stats.MISSED if stats.MISSED in verdicts else stats.UNDECIDED
               if stats.UNDECIDED in verdicts else stats.MET)
    return [stats.row(FIGURE, "linear, per-call cost flat (1 -> 1,000 within 1.25x)",
                      "; ".join(cells), verdict, unit="instructions per call, all threads",
                      **data)]
