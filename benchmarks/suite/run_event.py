"""``trainer.engine.run_event()`` from plain code (the way Composer users unit-test their
callbacks): instructions per handler (all threads) of one ``run_event(BATCH_START)`` with
10 no-op plain callbacks, over the same call with none. Target: at most 10k a handler."""

from __future__ import annotations

from typing import Any

from harness import stats
from harness.runner import Context
from harness.stats import Count

from suite import _calls

FIGURE = "`engine.run_event()` from plain code, 10 callbacks"


def calls(quick: bool) -> int:
    return 20 if quick else 200


def counts(quick: bool) -> dict[str, list[dict[str, Any]]]:
    return {"trainbus_fw": [{"run_event": calls(quick), "n": n} for n in (0, 10)]}


def run(ctx: Context) -> list[dict[str, Any]]:
    none = ctx.count_all("trainbus_fw", {"run_event": calls(ctx.quick), "n": 0})
    ten = ctx.count_all("trainbus_fw", {"run_event": calls(ctx.quick), "n": 10})
    loaded = None if ten.loaded is None or none.loaded is None else (ten.loaded - none.loaded) / 10
    per_handler = Count((ten.quiet - none.quiet) / 10, loaded)
    return [stats.row(
        FIGURE, "<= 10,000 a handler",
        f"trainbus {_calls.fmt(per_handler)} a handler{_calls.defect_note(per_handler)}; "
        f"the call itself with no callbacks {_calls.fmt(none)}",
        stats.count_verdict(per_handler, 10_000.0), unit="instructions per handler",
        trainbus=per_handler.as_dict(), no_callbacks=none.as_dict())]
