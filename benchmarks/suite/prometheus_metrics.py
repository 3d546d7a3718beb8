"""Instructions per batch with ``PrometheusMetrics`` on vs off, on the training thread and on
all threads (the tiny workload, no loggers, as every row of the suite: the logger's tap that
keeps the latest scalars is then never called). Target: at most 1% of a trainbus batch. A scrape runs on the
callback's server thread and reads counters as they are (``docs/watching-a-run.md``): the
training thread never waits for it, so no scrape happens here."""

from __future__ import annotations

from typing import Any

from harness import stats
from harness.runner import Context
from harness.stats import Count

from suite import _calls

FIGURE = "Prometheus metrics callback on vs off (instructions per batch)"


#: The two fits each figure subtracts, 100 batches apart (``batches`` of ``_calls``: 20). The
#: callback adds a few thousand instructions a batch, while the event loop's thread pays a
#: fit's fixed cost unevenly (up to ~350k between two fits of the same code): over 20 batches
#: that moved the delta from +1.5k to +15.6k a batch, over 100 from +2.8k to +5.3k
#: (``python benchmarks/investigations/delta_spread.py src --scenario prometheus``).
SPREAD = [10, 110]


def _configs(quick: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    b = [3, 13] if quick else SPREAD
    return _calls.config("noop", 0, quick, b), _calls.config("prometheus", 1, quick, b)


def counts(quick: bool) -> dict[str, list[dict[str, Any]]]:
    return {"trainbus_fw": list(_configs(quick))}


def _delta(on: Count, off: Count) -> Count:
    loaded = None if on.loaded is None or off.loaded is None else on.loaded - off.loaded
    return Count(on.quiet - off.quiet, loaded)


def run(ctx: Context) -> list[dict[str, Any]]:
    off, on = _configs(ctx.quick)
    batch = ctx.count_all("trainbus_fw", off)
    train = _delta(ctx.count("trainbus_fw", on), ctx.count("trainbus_fw", off))
    every = _delta(ctx.count_all("trainbus_fw", on), batch)
    target = 0.01 * batch.quiet
    share = every.quiet / batch.quiet if batch.quiet else 0.0
    return [stats.row(
        FIGURE, f"<= 1% of a batch ({target:,.0f})",
        f"+{_calls.fmt(every)} a batch, all threads ({share:.2%} of trainbus's "
        f"{batch.quiet:,.0f}); training thread +{_calls.fmt(train)}{_calls.defect_note(every)}; "
        "a scrape runs on the callback's server thread",
        stats.count_verdict(every, target), unit="instructions per batch",
        all_threads=every.as_dict(), training_thread=train.as_dict(), batch=batch.as_dict(),
        target=target)]
