"""The items an :class:`~trainbus.callbacks.EventStream` delivers, ready for JSON and SSE.

Items are small frozen dataclasses holding plain values only (logged tensors were turned
into floats and lists when the item was made), so they can be shared by every subscriber
and serialised without touching torch.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from trainbus.core.events import Event
from trainbus.core.timer import Timestamp

__all__ = [
    "StreamBusSnapshot",
    "StreamEvent",
    "StreamGap",
    "StreamItem",
    "StreamMetrics",
    "StreamStatistics",
    "json_ready",
]


def json_ready(value: Any) -> Any:
    """A JSON-ready copy of a logged value (tensors and arrays become lists/floats)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, numbers.Real):
        return json_ready(float(value))
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    tolist = getattr(value, "tolist", None)  # tensors, numpy arrays
    if callable(tolist):
        return json_ready(tolist())
    return repr(value)


_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


class _Item:
    """What every stream item can do: describe itself as a dict, JSON or an SSE message."""

    # The JSON text, once encoded: items are immutable and shared by every subscriber, so a
    # page that opens (or reconnects) replays the kept history without encoding it again.
    __slots__ = ("_json",)
    _json: str
    kind: ClassVar[str] = "item"

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def sse_event(self) -> str:
        """The name of the item in a server-sent ``event:`` line."""
        return self.kind

    def to_json(self) -> str:
        """The item as one line of JSON (``to_dict()`` serialised; encoded once, then kept)."""
        try:
            return self._json
        except AttributeError:
            text = _ENCODER.encode(self.to_dict())
            object.__setattr__(self, "_json", text)  # frozen: a cache, not a field
            return text

    def to_sse(self) -> str:
        """The item as one server-sent event: ``[id: <seq>]\\nevent: <name>\\ndata: <json>``.

        Numbered items carry their ``seq`` as the SSE ``id``, so a reconnecting browser
        sends it back as ``Last-Event-ID``.
        """
        seq = getattr(self, "seq", None)
        head = f"id: {seq}\n" if seq is not None else ""
        return f"{head}event: {self.sse_event}\ndata: {self.to_json()}\n\n"


@dataclass(frozen=True, slots=True, repr=False)
class StreamEvent(_Item):
    """An event of the run, as a subscriber receives it.

    Attributes:
        event: The :class:`~trainbus.Event`.
        timestamp: The run's counters at the event.
        wall_time: ``time.time()`` when the stream published it.
        seq: The stream's running count of items (gaps in it are dropped items).

    Example:
        >>> StreamEvent(Event.BATCH_END, Timestamp(batch=3), 0.0)
        StreamEvent(batch_end, epoch=0, batch=3)
    """

    event: Event
    timestamp: Timestamp
    wall_time: float
    seq: int = 0
    kind: ClassVar[str] = "event"

    @property
    def sse_event(self) -> str:
        """The event's name (``"batch_end"``), so browsers can listen per event."""
        return self.event.value

    def to_dict(self) -> dict[str, Any]:
        """``{"type": "event", "event": "batch_end", "seq", "wall_time", "epoch", ...}``."""
        return {
            "type": "event",
            "event": self.event.value,
            "seq": self.seq,
            "wall_time": self.wall_time,
            **self.timestamp.state_dict(),
        }

    def __repr__(self) -> str:
        ts = self.timestamp
        return f"StreamEvent({self.event.value}, epoch={ts._epoch}, batch={ts._batch})"


@dataclass(frozen=True, slots=True, repr=False)
class StreamMetrics(_Item):
    """One ``log_metrics`` (or ``log_hyperparameters``) call, as plain JSON-ready values.

    Attributes:
        metrics: Names to values (floats, ints, strings, lists); read-only.
        step: The step the values were logged at.
        wall_time: ``time.time()`` when they were logged.
        seq: The stream's running count of items.
        hyperparameters: Whether these are the run's hyperparameters.

    Example:
        >>> StreamMetrics({"loss/train": 0.5}, step=3, wall_time=0.0)
        StreamMetrics(step=3, loss/train=0.5)
    """

    metrics: Mapping[str, Any]
    step: int
    wall_time: float
    seq: int = 0
    hyperparameters: bool = False
    kind: ClassVar[str] = "metrics"

    @property
    def sse_event(self) -> str:
        """``"metrics"``, or ``"hyperparameters"``."""
        return "hyperparameters" if self.hyperparameters else "metrics"

    def to_dict(self) -> dict[str, Any]:
        """``{"type": "metrics", "step", "seq", "wall_time", "metrics": {...}}``."""
        return {
            "type": self.sse_event,
            "step": self.step,
            "seq": self.seq,
            "wall_time": self.wall_time,
            "metrics": dict(self.metrics),
        }

    def __repr__(self) -> str:
        values = ", ".join(f"{k}={v!r}" for k, v in self.metrics.items())
        label = "StreamHyperparameters" if self.hyperparameters else "StreamMetrics"
        return f"{label}(step={self.step}, {values})"


@dataclass(frozen=True, slots=True)
class StreamGap(_Item):
    """Stands where a slow subscriber lost ``missed`` items (the oldest it had buffered).

    Example:
        >>> StreamGap(missed=5).to_dict()
        {'type': 'gap', 'missed': 5}
    """

    missed: int
    kind: ClassVar[str] = "gap"

    def to_dict(self) -> dict[str, Any]:
        """``{"type": "gap", "missed": n}``."""
        return {"type": "gap", "missed": self.missed}


@dataclass(frozen=True, slots=True, repr=False)
class StreamBusSnapshot(_Item):
    """The bus's statistics and the latest spans of its timeline, at one moment.

    Published by a stream that watches an engine (:meth:`EventStream.watch`), every
    ``interval`` seconds and once more at the end of the run; the dashboard's callbacks
    panel and timeline draw from it.

    Attributes:
        statistics: ``engine.statistics()`` as plain values, per callback too, with the
            estimates a dashboard needs (``lag_batches`` and ``barrier_wait_caused`` per
            callback, from the timeline).
        timeline: The spans of the last few batches: ``{"row", "label", "start", "dur"}``
            with times in milliseconds since the recording began.
        wall_time: ``time.time()`` when it was taken.
        seq: The stream's running count of items.

    Example:
        >>> StreamBusSnapshot({"batches": 3, "callbacks": []}, (), 0.0).to_dict()["type"]
        'bus'
    """

    statistics: Mapping[str, Any]
    timeline: tuple[Mapping[str, Any], ...]
    wall_time: float
    seq: int = 0
    kind: ClassVar[str] = "bus"

    def to_dict(self) -> dict[str, Any]:
        """``{"type": "bus", "seq", "wall_time", "statistics": {...}, "timeline": [...]}``."""
        return {
            "type": "bus",
            "seq": self.seq,
            "wall_time": self.wall_time,
            "statistics": dict(self.statistics),
            "timeline": [dict(span) for span in self.timeline],
        }

    def __repr__(self) -> str:
        return f"StreamBusSnapshot(batches={self.statistics.get('batches')}, seq={self.seq})"


StreamItem = StreamEvent | StreamMetrics | StreamBusSnapshot | StreamGap


@dataclass(frozen=True, slots=True)
class StreamStatistics:
    """A snapshot of an :class:`EventStream`.

    Attributes:
        subscribers: Subscriptions connected now.
        published: Items published since the stream was created.
        dropped: Items dropped from subscribers' buffers (summed over subscribers).
        disconnected: Subscribers disconnected for falling behind.
        ended: Whether the run has closed (new subscriptions end at once).
    """

    subscribers: int
    published: int
    dropped: int
    disconnected: int
    ended: bool
