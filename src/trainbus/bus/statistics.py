"""Statistics of the bus: what ``Engine.statistics()`` returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from trainbus.bus.counters import Counters
    from trainbus.bus.members import Member
    from trainbus.bus.worker import Lane

__all__ = ["BusStatistics", "CallbackStatistics", "collect_statistics"]


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


def collect_statistics(members: Sequence[Member], lanes: Sequence[Lane] | None,
                       counters: Counters, now_batch: int) -> BusStatistics:
    """Read the counters into a :class:`BusStatistics` (any thread, no lock: each count is
    its writer's latest, not all from one instant); ``lanes``: the running or last session's."""
    per_callback = []
    depth = 0
    for member in members:
        lane = lanes[member.index] if lanes else None
        pending = records = lag = 0
        member_peak = member.peak
        if lane is not None:
            queue = lane.worker.queue
            pending = queue.enq - queue.done
            member_peak = max(member.peak, queue.peak)
            box = lane.mailbox
            records = box.depth if box is not None else lane.records.enq - lane.records.done
            if pending:
                lag = max(now_batch - queue.last_batch, 0)
            if lane.worker.lanes[0] is lane:  # a queue callbacks share counts once
                depth += pending
        slots = member.all_slots()
        here = [s for s in slots if s.here]  # plain @blocking: run by the training thread
        slowest = max(slots, key=lambda s: s.max_time, default=None)
        per_callback.append(
            CallbackStatistics(
                name=member.name,
                handled=sum(s.calls for s in slots),
                inline=sum(s.calls for s in here),
                total_time=sum(s.total_time for s in slots),
                max_time=max((s.max_time for s in slots), default=0.0),
                slowest=slowest.handler.qualname if slowest and slowest.calls else None,
                pending=pending,
                peak_pending=member_peak,
                on_thread=member.on_thread,
                pending_records=records,
                peak_pending_records=member.peak_records,
                lag_batches=lag,
                barrier_wait_caused=member.wait_caused,
                records_dropped=member.records_dropped,
                records_coalesced=member.records_coalesced,
                values_dropped=member.values_dropped,
                slow=member.slow,
                slow_batches=member.slow_batches,
                inline_time=sum(s.total_time for s in here),
            )
        )
    return BusStatistics(
        callbacks=tuple(per_callback),
        events_published=counters.published,
        batches=counters.batches,
        queue_depth=depth,
        peak_queue_depth=max((c.peak_pending for c in per_callback), default=0),
        lag_events=max((c.pending for c in per_callback), default=0),
        lag_batches=max((c.lag_batches for c in per_callback), default=0),
        barrier_waits=counters.barrier_waits,
        barrier_wait_time=counters.barrier_wait,
        backpressure_wait_time=counters.backpressure_wait,
        loop_wakeups=counters.loop_wakeups,
    )
