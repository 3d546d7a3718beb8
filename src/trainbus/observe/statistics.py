"""Statistics of the bus: what ``Engine.statistics()`` returns (``bus/counters.py`` fills
them from the bus's counts)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BusStatistics", "CallbackStatistics"]


@dataclass(frozen=True, slots=True)
class CallbackStatistics:
    """How one callback's lane is doing.

    Attributes:
        name: The callback's class name.
        handled: Handler calls completed (events and logged records).
        inline: Of those, the calls the training thread ran itself (plain ``@blocking``, D9).
        total_time: Seconds spent in the callback's handlers.
        max_time: The longest single handler call, in seconds.
        slowest: ``"Class.method"`` of the handler with the longest call.
        pending: Event handler calls queued or running now (for a pooled callback, its
            thread's: one queue for its callbacks).
        peak_pending: The most of those ever queued at once.
        on_thread: Whether it runs on a lane thread, its own or a shared one.
        pending_records: For a destination, records queued or being delivered now.
        peak_pending_records: For a destination, the most records ever queued at once (D12).
        records_dropped: For a destination with a lossy ``backpressure``, whole records
            its policy dropped (``docs/loggers.md``, "Falling behind").
        records_coalesced: Records its ``coalesce`` policy merged into an earlier one.
        values_dropped: Values lost: of dropped records, or overwritten by a newer one.
        lag_batches: Batches it trails the training thread by now (0 with nothing pending).
        barrier_wait_caused: Seconds the training thread waited (barriers, full queues,
            ``@blocking`` hand-overs) while this was the last callback it waited for.
        slow: Whether its handlers outlasted most batches the slow-callback check compared
            (the first few of each fit; ``SlowCallbackWarning``, D7).
        slow_batches: Of the batches the last check compared, those its handlers outlasted.
        inline_time: Of ``total_time``, its plain ``@blocking`` handlers' on the training thread.
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
    pending_records: int = 0
    peak_pending_records: int = 0
    lag_batches: int = 0
    barrier_wait_caused: float = 0.0
    records_dropped: int = 0
    records_coalesced: int = 0
    values_dropped: int = 0
    slow: bool = False
    slow_batches: int = 0
    inline_time: float = 0.0


@dataclass(frozen=True, slots=True)
class BusStatistics:
    """A snapshot of the bus.

    Attributes:
        callbacks: One entry per callback, in registration order.
        events_published: Events the training thread published.
        batches: ``BATCH_END`` events published.
        queue_depth: Event handler calls queued or running, all callbacks together (a
            pool thread's queue counted once).
        peak_queue_depth: The deepest any one callback's queue has been.
        lag_events: How many event handler calls the furthest-behind callback trails by.
        lag_batches: How many batches the furthest-behind callback trails by.
        barrier_waits: How often the training thread waited at a barrier.
        barrier_wait_time: Seconds it waited at barriers (and for ``@blocking`` handlers' turns).
        backpressure_wait_time: Seconds it spent waiting for a full queue (D12).
        loop_wakeups: How often another thread woke the event loop to run handlers.
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
    loop_wakeups: int = 0

    @property
    def handler_time(self) -> float:
        """Seconds spent in handlers, all callbacks together."""
        return sum(c.total_time for c in self.callbacks)
