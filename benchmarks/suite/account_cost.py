"""The goodput account's own cost: instructions per batch on the training thread with the
time account on (the default) vs off (``Trainer(track_time=False)``), the tiny workload,
no callbacks, the progress output off (its bar is a callback: not the account's cost).
Target: the difference at most 2% of a batch (SPEC section 7)."""

from __future__ import annotations

from typing import Any

from harness import stats
from harness.runner import Context
from harness.stats import Count

from suite import _calls

FIGURE = "the goodput account on vs off (instructions per batch, tiny workload)"
SHARE = 0.02


def _configs(quick: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    return _calls.config("noop", 0, quick), _calls.config("noop-untracked", 0, quick)


def counts(quick: bool) -> dict[str, list[dict[str, Any]]]:
    return {"trainbus_fw": list(_configs(quick))}


def run(ctx: Context) -> list[dict[str, Any]]:
    on_cfg, off_cfg = _configs(ctx.quick)
    cells, data, verdicts = [], {}, []
    for thread, get in (("training thread", ctx.count), ("all threads", ctx.count_all)):
        on, off = get("trainbus_fw", on_cfg), get("trainbus_fw", off_cfg)
        loaded = None if on.loaded is None or off.loaded is None else on.loaded - off.loaded
        cost = Count(on.quiet - off.quiet, loaded)
        share = cost.quiet / off.quiet if off.quiet else 0.0
        # The account runs on the training thread: its count decides (and is checked for
        # moving with load). All threads add the lane threads' and the loop's own counts,
        # whose small differences between two fits are not the account's.
        note = _calls.defect_note(cost) if thread == "training thread" else ""
        cells.append(
            f"{thread}: +{_calls.fmt(cost)} a batch over {off.quiet:,.0f} without it "
            f"({share:+.2%}){note}"
        )
        data[thread] = {"on": on.as_dict(), "off": off.as_dict(), "cost": cost.as_dict()}
        verdicts.append(stats.count_verdict(cost, SHARE * off.quiet))
    verdict = verdicts[0]  # the training thread's: the account runs there
    off_train = ctx.count("trainbus_fw", off_cfg).quiet
    return [stats.row(
        FIGURE, f"<= 2% of a batch ({SHARE * off_train:,.0f})", "; ".join(cells), verdict,
        unit="instructions per batch", **data)]
