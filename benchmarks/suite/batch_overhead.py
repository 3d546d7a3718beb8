"""Instructions per batch with no callbacks, over the plain loop's (all threads): what a
framework costs a batch before any callback. Target: at most Ignite's, same run."""

from __future__ import annotations

from typing import Any

from harness import stats
from harness.runner import LABELS, Context
from harness.stats import Count

from suite import _calls

FIGURE = "per batch, no callbacks, over the plain loop"


def counts(quick: bool) -> dict[str, list[dict[str, Any]]]:
    return {a: [_calls.config("noop", 0, quick)] for a in (*_calls.FLOOR_AND_PEERS, "trainbus_fw")}


def over_floor(ctx: Context, adapter: str) -> Count:
    cfg = _calls.config("noop", 0, ctx.quick)
    fw, floor = ctx.count_all(adapter, cfg), ctx.count_all("plain", cfg)
    loaded = None if fw.loaded is None or floor.loaded is None else fw.loaded - floor.loaded
    return Count(fw.quiet - floor.quiet, loaded)


def run(ctx: Context) -> list[dict[str, Any]]:
    tb = over_floor(ctx, "trainbus_fw")
    floor = ctx.count_all("plain", _calls.config("noop", 0, ctx.quick))
    cells, data = [f"plain loop {_calls.fmt(floor)} a batch"], {}
    target = 141_000.0
    for adapter in ("ignite_fw", "lightning_fw", "composer_fw"):
        if reason := ctx.count_reason(adapter):
            cells.append(f"{LABELS[adapter]}: {reason}")
            continue
        try:
            c = over_floor(ctx, adapter)
        except RuntimeError as exc:  # its callgrind process failed: the row says so
            cells.append(f"{LABELS[adapter]}: {str(exc)[:200]}")
            continue
        data[adapter] = c.as_dict()
        cells.append(f"{LABELS[adapter]} +{_calls.fmt(c)}")
        if adapter == "ignite_fw":
            target = c.quiet
    return [stats.row(
        FIGURE, f"<= Ignite's (+{target:,.0f})",
        f"trainbus +{_calls.fmt(tb)}{_calls.defect_note(tb)}. {'; '.join(cells)}",
        stats.count_verdict(tb, target), unit="instructions per batch",
        trainbus=tb.as_dict(), peers=data, floor=floor.as_dict(), target=target)]
