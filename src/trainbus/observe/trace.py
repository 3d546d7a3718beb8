"""Timeline recording: when each handler ran on which lane, when the producer waited.

Enable with ``engine.record_trace()``; export with :meth:`TraceRecorder.chrome_trace` (the
Chrome trace-event JSON that Perfetto and ``chrome://tracing`` open), a row per lane::

    training thread  [batch 1][wait: barrier][batch 2]...
    CSVLogger           [batch_end]    [log_record]...
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainbus.core.events import Event

__all__ = ["TraceRecorder", "TraceSpan"]

PRODUCER_ROW = "training thread"


@dataclass(frozen=True, slots=True)
class TraceSpan:
    """One interval on one row of the timeline (times in ``perf_counter`` seconds)."""

    row: str
    label: str
    start: float
    duration: float
    thread: int


class TraceRecorder:
    """Collects spans from every thread.

    Invariant: recording threads only append on the right of ``_spans`` (one atomic
    ``deque.append`` each); only :meth:`drain` pops, on the left.

    Args:
        max_spans: Keep only the newest this many spans (a ring: memory stays flat over a
            long run); ``None`` keeps every span.
    """

    def __init__(self, max_spans: int | None = None) -> None:
        if max_spans is not None and (isinstance(max_spans, bool) or max_spans < 1):
            raise ValueError(f"max_spans={max_spans!r} must be a positive int, or None")
        self._spans: deque[tuple[str, str, float, float, int]] = deque(maxlen=max_spans)
        self.origin = time.perf_counter()

    def handler(self, lane: str, event: Event | None, start: float, duration: float) -> None:
        """Record a handler call on ``lane``."""
        label = event.value if event is not None else "log_record"
        self._spans.append((lane, label, start, duration, threading.get_ident()))

    def producer_wait(self, kind: str, start: float, duration: float) -> None:
        """Record the training thread waiting (``barrier`` or ``backpressure``)."""
        self._spans.append((PRODUCER_ROW, f"wait: {kind}", start, duration, 0))

    def producer_span(self, label: str, start: float, duration: float) -> None:
        """Record work on the training thread (the trainer marks its batches)."""
        self._spans.append((PRODUCER_ROW, label, start, duration, 0))

    def spans(self) -> Iterator[TraceSpan]:
        """The recorded spans, in recording order."""
        for span in list(self._spans):
            yield TraceSpan(*span)

    def drain(self) -> list[TraceSpan]:
        """The spans recorded since the last ``drain``, oldest first; they are forgotten
        (a live view reads its feed this way, while other threads record)."""
        spans = self._spans
        out: list[TraceSpan] = []
        for _ in range(len(spans)):
            try:
                out.append(TraceSpan(*spans.popleft()))
            except IndexError:
                break
        return out

    def chrome_trace(self) -> dict[str, Any]:
        """The spans as a Chrome trace-event document (one row per lane)."""
        rows: dict[str, int] = {PRODUCER_ROW: 0}
        events: list[dict[str, Any]] = []
        for span in self.spans():
            tid = rows.setdefault(span.row, len(rows))
            start = (span.start - self.origin) * 1e6
            events.append({"name": span.label, "ph": "X", "pid": 1, "tid": tid, "ts": start,
                           "dur": span.duration * 1e6})
        events += [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": row}}
                   for row, tid in rows.items()]
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def save(self, path: str | Path) -> Path:
        """Write :meth:`chrome_trace` to ``path`` and return the path."""
        out = Path(path)
        out.write_text(json.dumps(self.chrome_trace()))
        return out
