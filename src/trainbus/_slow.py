"""Detecting callbacks slower than the batches they observe (``SlowCallbackWarning``).

At each of the first few ``BATCH_END`` events the training thread compares, per callback,
the time its handlers took since the previous check with the batch's own time: the time
between the two ``BATCH_END`` events less what the training thread spent waiting (for these
very handlers, at barriers and full queues). A callback slower than its batches in most of
the checked batches gets one warning naming it and its slowest event.
"""

from __future__ import annotations

import time
import warnings
from typing import TYPE_CHECKING

from trainbus._exceptions import SlowCallbackWarning

if TYPE_CHECKING:
    from trainbus._bus import EventBus
    from trainbus._lanes import Lane

__all__ = ["SlowCallbacks"]

#: Batches (after the first) whose handler time is compared with the batch time.
CHECK_BATCHES = 3
#: Handler time per batch under which a callback is never called slow (seconds): below
#: it, the batch is tiny and scheduling noise dominates.
MIN_BUSY = 5e-3


class SlowCallbacks:
    """The state of the check for one session (training thread only)."""

    __slots__ = ("checks", "last_batch_end", "wait_mark")

    def __init__(self) -> None:
        self.checks = 0
        self.last_batch_end = 0.0
        self.wait_mark = 0.0

    @property
    def checking(self) -> bool:
        """Whether batches are still being checked."""
        return self.checks <= CHECK_BATCHES

    def at_batch_end(self, bus: EventBus) -> None:
        """Check the batch that just ended; warn once the checks are done."""
        now = time.perf_counter()
        waited = bus._barrier_wait + bus._backpressure_wait
        batch_time = (now - self.last_batch_end) - (waited - self.wait_mark)
        self.last_batch_end = now
        self.wait_mark = waited
        self.checks += 1
        if self.checks == 1:  # the first batch carries start-up costs
            for lane in bus.lanes:
                lane.busy_mark = lane.busy
            return
        for lane in bus.lanes:
            busy, lane.busy_mark = lane.busy - lane.busy_mark, lane.busy
            if busy > batch_time and busy > MIN_BUSY:
                lane.slow_batches += 1
        if self.checks > CHECK_BATCHES:
            for lane in bus.lanes:
                if lane.slow_batches >= CHECK_BATCHES - 1:
                    bus.loop.call_soon(_emit, bus, _message(lane))


def _message(lane: Lane) -> str:
    slowest = max(lane.slots.values(), key=lambda s: s.total_time, default=None)
    where = slowest.handler.qualname if slowest is not None else lane.name
    event = f"Event.{slowest.event.name}" if slowest and slowest.event else "its events"
    advice = (
        "move the work off the per-batch events, or let handlers trail with "
        "Trainer(max_lag=...)"
    )
    if slowest is not None and not slowest.is_async:
        advice = "make its blocking I/O async, " + advice
    return (
        f"callback {lane.name} spends longer in its handlers than a batch takes "
        f"(slowest: {where} on {event}); training waits for it at every barrier: {advice}"
    )


def _emit(bus: EventBus, message: str) -> None:
    """Warn on the loop thread, where the caller's warning filters apply."""
    try:
        warnings.warn(message, SlowCallbackWarning, stacklevel=1)
    except Warning as exc:  # warnings turned into errors: fail like a handler would
        bus._fail(exc, None, None)
