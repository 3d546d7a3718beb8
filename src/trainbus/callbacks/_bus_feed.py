"""Snapshots of a trainer's bus for a dashboard: statistics plus the latest timeline.

:class:`BusFeed` turns ``engine.statistics()`` and the spans of ``engine.record_trace()``
into a :class:`~trainbus.callbacks.StreamBusSnapshot`. It runs on the event loop (from a
stream's handlers) or the dashboard's server thread, never on the training thread, and
keeps memory flat: the recorder holds at most ``max_recorded`` spans (the oldest go first,
whether or not a snapshot took them), each snapshot takes the recorder's new spans, and
the feed keeps only the last few thousand.

Every per-callback figure is one of ``engine.statistics()``'s
(:class:`~trainbus.CallbackStatistics`), counted by the bus: ``lag_batches`` (how far the
callback trails now) and ``barrier_wait_caused`` (the producer's waits it ended) included.
The snapshot's ``estimated`` list names figures estimated rather than counted: none today.

Each snapshot says which point of the run its figures are from: ``batch`` and ``epoch``,
the trainer's timer when it was taken (the page shows "as of batch N"). That is the run's
own count, the one the page's header shows; the bus's ``batches`` counts only the batches
this engine published (fewer in a resumed run).

Callbacks whose class name starts with ``_`` are private helpers of trainbus itself (the
demo's ``_TrainingClock``), not the user's: their rows and timeline spans are left out;
their time still counts in the totals (``handler_time``).
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

from trainbus.callbacks._stream_items import StreamBusSnapshot
from trainbus.observe.trace import PRODUCER_ROW

if TYPE_CHECKING:
    from trainbus.bus.engine import Engine
    from trainbus.observe.trace import TraceRecorder

__all__ = ["BusFeed"]

#: Spans ending before the timeline's start that the timeline's scan steps over.
_SLACK = 64

_Span = tuple[str, str, float, float, int]  # row, label, start, duration, thread


def _private(name: str) -> bool:
    """Whether a callback (by its statistics name) is a private helper, not the user's."""
    return name.startswith("_")


class BusFeed:
    """Makes :class:`StreamBusSnapshot` items of one engine.

    Args:
        engine: The trainer's engine (``trainer.engine``); recording its timeline starts
            now (``engine.record_trace()``).
        timeline_batches: How many of the latest batches the timeline covers.
        max_spans: The most spans one snapshot carries (the newest are kept).
        max_recorded: The most spans the recorder holds between two snapshots (the
            oldest are forgotten first): memory stays flat even when no snapshot is taken.

    Example:
        >>> feed = BusFeed(trainer.engine)
        >>> feed.snapshot().statistics["callbacks"][0]["name"]
        'SpeedMonitor'
    """

    def __init__(
        self,
        engine: Engine,
        *,
        timeline_batches: int = 6,
        max_spans: int = 600,
        max_recorded: int = 8192,
    ) -> None:
        self.engine = engine
        self.recorder: TraceRecorder = engine.record_trace(max_spans=max_recorded)
        self.timeline_batches = timeline_batches
        self.max_spans = max_spans
        self._recent: deque[_Span] = deque(maxlen=4096)
        self._batch_starts: deque[float] = deque(maxlen=max(1, timeline_batches))

    def _take_new(self) -> list[_Span]:
        """The spans recorded since the last call; the recorder forgets them."""
        return [(s.row, s.label, s.start, s.duration, s.thread) for s in self.recorder.drain()]

    def _account(self, new: list[_Span]) -> None:
        for span in new:
            row, label, start, _, _ = span
            if row == PRODUCER_ROW and label.startswith("batch"):
                self._batch_starts.append(start)
            self._recent.append(span)

    def _timeline(self) -> tuple[dict[str, Any], ...]:
        if not self._batch_starts:
            return ()
        since = self._batch_starts[0]  # the start of the oldest batch shown
        # Newest first, stopping well past the first span that ended before `since` (spans
        # arrive in about the order they ended): no scan of the whole recent history.
        chosen: list[_Span] = []
        older = 0
        for span in reversed(self._recent):
            if span[2] + span[3] >= since:
                chosen.append(span)
                if len(chosen) >= self.max_spans:
                    break
            else:
                older += 1
                if older > _SLACK:
                    break
        chosen = [span for span in chosen if not _private(span[0])]
        chosen.reverse()
        origin = self.recorder.origin
        return tuple(
            {
                "row": row,
                "label": label,
                "start": round((start - origin) * 1e3, 3),
                "dur": round(duration * 1e3, 3),
            }
            for row, label, start, duration, _ in chosen
        )

    def take(self) -> None:
        """Fold the recorder's new spans into the timeline, without making a snapshot.

        Cheap (no snapshot is built): call it between snapshots nobody asked for, so
        that the timeline misses no span the bounded recorder would forget.
        """
        self._account(self._take_new())

    def statistics(self) -> dict[str, Any]:
        """``engine.statistics()`` as plain values, with the timer's ``batch`` and ``epoch``.

        Private callbacks are left out of ``callbacks`` (see the module); ``estimated``
        names figures that are estimated: none.
        """
        self._account(self._take_new())
        now = self.engine.state.timestamp  # first: the figures are from this batch or later
        stats = self.engine.statistics()
        callbacks = []
        for c in stats.callbacks:
            if _private(c.name):
                continue
            row: dict[str, Any] = {
                "name": c.name,
                "handled": c.handled,
                "inline": c.inline,
                "total_time": c.total_time,
                "max_time": c.max_time,
                "mean_time": c.total_time / c.handled if c.handled else 0.0,
                "slowest": c.slowest,
                "pending": c.pending,
                "peak_pending": c.peak_pending,
                "pending_records": c.pending_records,
                "peak_pending_records": c.peak_pending_records,
                "on_thread": c.on_thread,
                "lag_batches": c.lag_batches,
                "barrier_wait_caused": c.barrier_wait_caused,
            }
            callbacks.append(row)
        return {
            "batch": int(now.batch),
            "epoch": int(now.epoch),
            "batches": stats.batches,
            "events_published": stats.events_published,
            "queue_depth": stats.queue_depth,
            "peak_queue_depth": stats.peak_queue_depth,
            "lag_events": stats.lag_events,
            "lag_batches": stats.lag_batches,
            "barrier_waits": stats.barrier_waits,
            "barrier_wait_time": stats.barrier_wait_time,
            "backpressure_wait_time": stats.backpressure_wait_time,
            "handler_time": stats.handler_time,
            "callbacks": callbacks,
            "estimated": [],
        }

    def snapshot(self) -> StreamBusSnapshot:
        """A new snapshot (its ``seq`` is set when a stream publishes it)."""
        statistics = self.statistics()
        return StreamBusSnapshot(statistics, self._timeline(), time.time())
