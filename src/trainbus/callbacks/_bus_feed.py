"""Snapshots of a trainer's bus for a dashboard: statistics plus the latest timeline.

:class:`BusFeed` turns ``engine.statistics()`` and the spans of ``engine.record_trace()``
into a :class:`~trainbus.callbacks.StreamBusSnapshot`. It runs on the event loop (from a
stream's handlers) or the dashboard's server thread, never on the training thread, and
keeps memory flat: the recorder holds at most ``max_recorded`` spans (the oldest go first,
whether or not a snapshot took them), each snapshot takes the recorder's new spans, and
the feed keeps only the last few thousand.

Every per-callback figure is one of ``engine.statistics()``'s
(:class:`~trainbus.CallbackStatistics`) where the bus counts it. Two are not counted per
callback by the bus, so they are estimated from the timeline and named in the snapshot's
``estimated`` list (a field of the bus with the same name replaces the estimate):

- ``barrier_wait_caused``: each barrier wait of the training thread is charged to the
  callback whose handler ended last inside it (the one that released the barrier);
- ``lag_batches``: for a callback with queued work, the batches the training thread
  finished since that callback's last handler ended, at most the bus's own
  ``lag_batches`` (that of the furthest-behind callback).
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from trainbus import CallbackStatistics
from trainbus.callbacks._stream_items import StreamBusSnapshot

if TYPE_CHECKING:
    from trainbus import Engine, TraceRecorder

__all__ = ["BusFeed"]

#: The timeline row of the training thread (``TraceRecorder``'s producer row).
PRODUCER_ROW = "training thread"
#: The figures a snapshot estimates per callback unless the bus counts them.
ESTIMATED = ("lag_batches", "barrier_wait_caused")
#: Spans ending before the timeline's start that the timeline's scan steps over.
_SLACK = 64

_Span = tuple[str, str, float, float, int]  # row, label, start, duration, thread


def _released_by(
    handlers: deque[tuple[float, str, float]], start: float, end: float
) -> str | None:
    """The callback whose handler ended last inside ``[start, end]`` (a little slack).

    A handler that started after the wait ended cannot have released it (the training
    thread runs cheap handlers itself right after a barrier): it is not a candidate.
    """
    best: tuple[float, str] | None = None
    for handler_end, row, handler_start in handlers:
        if (
            start <= handler_end <= end + 0.002
            and handler_start < end
            and (best is None or handler_end > best[0])
        ):
            best = (handler_end, row)
    return best[1] if best else None


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
        self.recorder: TraceRecorder = engine.record_trace()
        # Bound the recorder before anything records: a ring instead of its list. (The bus
        # has no bounded recorder of its own; its appends take the attribute at each call.)
        if isinstance(getattr(self.recorder, "_spans", None), list):
            self.recorder._spans = deque(maxlen=max_recorded)  # type: ignore[assignment]
        self.timeline_batches = timeline_batches
        self.max_spans = max_spans
        self._recent: deque[_Span] = deque(maxlen=4096)
        self._batch_ends: list[float] = []
        self._batch_starts: deque[float] = deque(maxlen=max(1, timeline_batches))
        self._last_handlers: deque[tuple[float, str, float]] = deque(maxlen=32)
        self._last_end: dict[str, float] = {}
        self._caused: dict[str, float] = {}
        self._read = 0

    def _take_new(self) -> list[_Span]:
        """The spans recorded since the last call; the recorder forgets them."""
        spans = getattr(self.recorder, "_spans", None)
        if isinstance(spans, deque):
            # Other threads only append (on the right): popping on the left is safe.
            new: list[_Span] = []
            for _ in range(len(spans)):
                try:
                    new.append(spans.popleft())
                except IndexError:
                    break
            return new
        every = [(s.row, s.label, s.start, s.duration, s.thread) for s in self.recorder.spans()]
        new, self._read = every[self._read :], len(every)
        return new

    def _account(self, new: list[_Span]) -> None:
        # Spans arrive in the order they ended, so the handler that released a barrier
        # is among the last few handler spans recorded before the wait's own span.
        handlers = self._last_handlers
        for span in new:
            row, label, start, duration, _ = span
            end = start + duration
            if row == PRODUCER_ROW:
                if label.startswith("batch"):
                    self._batch_ends.append(end)
                    self._batch_starts.append(start)
                elif label == "wait: barrier" and duration > 0:
                    culprit = _released_by(handlers, start, end)
                    if culprit is not None:
                        self._caused[culprit] = self._caused.get(culprit, 0.0) + duration
            else:
                handlers.append((end, row, start))
                if end > self._last_end.get(row, 0.0):
                    self._last_end[row] = end
            self._recent.append(span)
        if len(self._batch_ends) > 8192:
            del self._batch_ends[:-4096]

    def _lag(self, name: str, pending: int, most: int) -> int:
        if pending <= 0:
            return 0
        last = self._last_end.get(name, 0.0)
        return min(most, len(self._batch_ends) - bisect.bisect_right(self._batch_ends, last))

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
        """Fold the recorder's new spans into the estimates, without making a snapshot.

        Cheap (no snapshot is built): call it between snapshots nobody asked for, so
        that the estimates miss no span the bounded recorder would forget.
        """
        self._account(self._take_new())

    def statistics(self) -> dict[str, Any]:
        """``engine.statistics()`` as plain values, with the per-callback estimates.

        ``estimated`` names the per-callback figures that come from the timeline, not
        from the bus (see the module's docstring).
        """
        self._account(self._take_new())
        stats = self.engine.statistics()
        estimated = [name for name in ESTIMATED if not hasattr(CallbackStatistics, name)]
        callbacks = []
        for c in stats.callbacks:
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
                "lag_batches": getattr(c, "lag_batches", None),
                "barrier_wait_caused": getattr(c, "barrier_wait_caused", None),
            }
            if row["lag_batches"] is None:
                row["lag_batches"] = self._lag(c.name, c.pending, stats.lag_batches)
            if row["barrier_wait_caused"] is None:
                row["barrier_wait_caused"] = self._caused.get(c.name, 0.0)
            callbacks.append(row)
        return {
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
            "estimated": estimated,
        }

    def snapshot(self) -> StreamBusSnapshot:
        """A new snapshot (its ``seq`` is set when a stream publishes it)."""
        statistics = self.statistics()
        return StreamBusSnapshot(statistics, self._timeline(), time.time())
