"""What the bus counts over an engine's life: events, batches, the training thread's waits."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainbus.observe.clock import BatchClock
    from trainbus.observe.trace import TraceRecorder

__all__ = ["Counters"]


class Counters:
    """The training thread writes these (the loop thread ``loop_wakeups``);
    ``Engine.statistics()`` reads them (``engine.py``'s ``_collect_statistics``).

    Attributes:
        trace, clock: The timeline recorder, the batch clock (``observe/clock.py``), while kept.
    """

    __slots__ = ("backpressure_wait", "barrier_wait", "barrier_waits", "batches", "clock",
                 "loop_wakeups", "published", "trace")

    def __init__(self) -> None:
        self.published = 0
        self.batches = 0
        self.barrier_waits = 0
        self.barrier_wait = 0.0
        self.backpressure_wait = 0.0
        self.loop_wakeups = 0
        self.trace: TraceRecorder | None = None
        self.clock: BatchClock | None = None
