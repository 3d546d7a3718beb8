"""``async def`` handler call: instructions per no-op call on the training thread and on
all threads (the event loop's included), 10 callbacks, as ``call_blocking``."""

from __future__ import annotations

from typing import Any

from harness.runner import Context

from suite import _calls, call_plain

FIGURE = "`async def` call, training thread"
FIGURE_ALL = "`async def` call, all threads"
KIND = "noop-async"


def counts(quick: bool) -> dict[str, list[dict[str, Any]]]:
    return _calls.plan(quick, KIND)


def run(ctx: Context) -> list[dict[str, Any]]:
    return call_plain.rows(ctx, KIND, (FIGURE, FIGURE_ALL), (2000.0, 9300.0), "2.5x Ignite")
