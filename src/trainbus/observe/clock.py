"""``BatchClock``: when each batch ended, as the training thread publishes ``BATCH_END``.

Observation, like the timeline (``trace.py``): while an engine has a clock
(:meth:`Engine.batch_clock`), the bus's producer reads the clock once at each batch's end
and counts the step (the time since the previous batch's end) into a fixed histogram; no
handler runs, no snapshot is taken. A health check and Prometheus' step-time histogram read it.
"""

from __future__ import annotations

import bisect
from collections import deque

__all__ = ["STEP_BUCKETS", "BatchClock"]

#: The step-time histogram's bucket bounds, in seconds (``le``; +Inf is implied).
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0, 60.0, 300.0)  # fmt: skip
_bucket = bisect.bisect_left


class BatchClock:
    """The batches' ends and step times (module doc).

    Attributes:
        last: ``time.perf_counter()`` at the last batch's end, or ``None`` (none since
            :meth:`restart`).
        bounds: The histogram's bucket bounds (:data:`STEP_BUCKETS`).
        counts: Steps per bucket; the last one counts those above every bound.
        total: Seconds of every step counted.
        recent: The last 32 steps, in seconds.

    Invariant: the training thread alone writes (:meth:`tick`, :meth:`restart`); readers on
    other threads copy the fields as they are, a batch old at worst.
    """

    __slots__ = ("bounds", "counts", "last", "recent", "total")

    def __init__(self) -> None:
        self.last: float | None = None
        self.bounds = STEP_BUCKETS
        self.counts = [0] * (len(STEP_BUCKETS) + 1)
        self.total = 0.0
        self.recent: deque[float] = deque(maxlen=32)

    def tick(self, now: float) -> None:
        """A batch ended at ``now`` (training thread, the producer)."""
        last, self.last = self.last, now
        if last is not None:
            step = now - last
            self.recent.append(step)
            self.counts[_bucket(self.bounds, step)] += 1
            self.total += step

    def restart(self) -> None:
        """A new fit (training thread): its first batch counts no step."""
        self.last = None
