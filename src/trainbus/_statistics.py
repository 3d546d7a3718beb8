"""Statistics of the bus: what ``Engine.statistics()`` returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainbus._bus import EventBus

__all__ = ["BusStatistics", "CallbackStatistics", "collect_statistics"]


@dataclass(frozen=True, slots=True)
class CallbackStatistics:
    """How one callback's lane is doing.

    Attributes:
        name: The callback's class name.
        handled: Handler calls completed (events and logged records).
        inline: Of those, plain handlers so fast they ran on the training thread.
        total_time: Seconds spent in the callback's handlers.
        max_time: The longest single handler call, in seconds.
        slowest: ``"Class.method"`` of the handler with the longest call.
        pending: Event handler calls queued or running now.
        peak_pending: The most event handler calls ever queued at once.
        on_thread: Whether the callback has a thread lane (it has plain handlers).
    """

    name: str
    handled: int
    inline: int
    total_time: float
    max_time: float
    slowest: str | None
    pending: int
    peak_pending: int
    on_thread: bool


@dataclass(frozen=True, slots=True)
class BusStatistics:
    """A snapshot of the bus.

    Attributes:
        callbacks: One entry per callback, in registration order.
        events_published: Events the training thread published.
        batches: ``BATCH_END`` events published.
        queue_depth: Event handler calls queued or running, all callbacks together.
        peak_queue_depth: The deepest any one callback's queue has been.
        lag_events: How many event handler calls the furthest-behind callback trails by.
        lag_batches: How many batches the furthest-behind callback trails by.
        barrier_waits: How often the training thread waited at a barrier.
        barrier_wait_time: Seconds the training thread spent waiting at barriers
            (including ``@blocking`` handlers' lanes).
        backpressure_wait_time: Seconds it spent waiting for a full queue (D12).
    """

    callbacks: tuple[CallbackStatistics, ...]
    events_published: int
    batches: int
    queue_depth: int
    peak_queue_depth: int
    lag_events: int
    lag_batches: int
    barrier_waits: int
    barrier_wait_time: float
    backpressure_wait_time: float

    @property
    def handler_time(self) -> float:
        """Seconds spent in handlers, all callbacks together."""
        return sum(c.total_time for c in self.callbacks)


def collect_statistics(bus: EventBus) -> BusStatistics:
    """Read ``bus``'s counters into a :class:`BusStatistics` (any thread; approximate)."""
    per_callback = []
    depth = peak = lag_events = 0
    lag_batches = 0
    now_batch = bus.state._timer.snapshot()._batch
    for lane in bus.lanes:
        slots = lane.statistics_slots()
        pending = lane.enq - lane.done
        slowest = max(slots, key=lambda s: s.max_time, default=None)
        per_callback.append(
            CallbackStatistics(
                name=lane.name,
                handled=sum(s.calls for s in slots),
                inline=sum(s.inline_calls for s in slots),
                total_time=sum(s.total_time for s in slots),
                max_time=max((s.max_time for s in slots), default=0.0),
                slowest=slowest.handler.qualname if slowest and slowest.calls else None,
                pending=pending,
                peak_pending=lane.peak,
                on_thread=lane.on_thread,
            )
        )
        depth += pending
        peak = max(peak, lane.peak)
        lag_events = max(lag_events, pending)
        if pending:
            lag_batches = max(lag_batches, now_batch - lane.last_batch)
    return BusStatistics(
        callbacks=tuple(per_callback),
        events_published=bus._published,
        batches=bus._batches,
        queue_depth=depth,
        peak_queue_depth=peak,
        lag_events=lag_events,
        lag_batches=lag_batches,
        barrier_waits=bus._barrier_waits,
        barrier_wait_time=bus._barrier_wait,
        backpressure_wait_time=bus._backpressure_wait,
    )
