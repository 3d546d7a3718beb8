"""Running one event item, and accounting for it, the same way on every thread.

Whoever runs a lane (its thread, a dispatcher task, or the training thread on the inline
fast path) finishes each event item through :func:`finish_event`, and runs plain handlers
through :func:`call_plain`, so statistics, traces, failures and the ``done`` count that
barriers wait for never differ between the paths.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainbus.bus._gate import Gate
    from trainbus.bus._items import EventItem
    from trainbus.bus._lane import Lane
    from trainbus.bus._slot import Slot
    from trainbus.bus._statistics import Counters

__all__ = ["call_plain", "finish_event", "skip_event"]

_perf = time.perf_counter


def call_plain(gate: Gate, lane: Lane, slot: Slot, item: EventItem) -> float:
    """Call a plain handler here; report a failure to the gate; return the seconds taken."""
    t0 = _perf()
    try:
        slot.fn(item.view, item.logger)
    except BaseException as exc:
        gate.fail(exc, slot.handler, slot.event, lane)
    return _perf() - t0


def finish_event(
    lane: Lane, slot: Slot, item: EventItem, elapsed: float, counters: Counters
) -> None:
    """Account a finished event item of ``lane`` and count it done."""
    slot.account(elapsed)
    lane.last_batch = item.batch
    trace = counters.trace
    if trace is not None:
        trace.handler(lane.name, slot.event, _perf() - elapsed, elapsed)
    lane.count_done()


def skip_event(lane: Lane) -> None:
    """Count an event item done without running it (the session is stopping: D10)."""
    lane.count_done()
