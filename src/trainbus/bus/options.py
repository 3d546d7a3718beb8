"""The bus's options, validated in one place for :class:`~trainbus.Engine` and the Trainer:
a bad value fails before anything runs, naming the argument and a value that works.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from trainbus.core.events import Event

__all__ = ["DEFAULT_CLOSE_TIMEOUT", "DEFAULT_LANE_THREADS", "DEFAULT_WAIT_WARNING", "BusOptions"]

#: Seconds each callback's ``close`` (and ``post_close``) may take before it is abandoned.
DEFAULT_CLOSE_TIMEOUT = 30.0
#: Seconds a barrier or a close may wait before a warning names what it waits for.
DEFAULT_WAIT_WARNING = 10.0
#: Lane threads the plain callbacks share (``docs/performance-notes.md`` says why eight).
DEFAULT_LANE_THREADS = 8


@dataclass(frozen=True, slots=True)
class BusOptions:
    """How the bus schedules handlers; see ``docs/concurrency.md``.

    Attributes:
        barriers: Events at which the training thread waits for every earlier handler.
        max_lag: Batches by which handlers may trail a ``BATCH_END`` barrier.
        queue_size: Handler calls (and records) that may wait per callback before the
            training thread waits (D12).
        warn_slow: Whether to emit :class:`~trainbus.SlowCallbackWarning`.
        close_timeout: Seconds each callback's ``close`` / ``post_close`` may take before
            it is reported and abandoned (``math.inf``: wait for ever); a callback with its
            own ``close_timeout`` (the uploaders retry that long) gets at least that plus 5 s.
        wait_warning: Seconds after which the training thread waiting at a barrier (or a
            close waiting for a callback) emits a :class:`~trainbus.CallbackTimeoutWarning`
            naming the callback and the handler it waits for (``math.inf``: never).
        lane_threads: Threads in the pool that runs plain callbacks' handlers; each plain
            callback is pinned to one of them for the whole run (callbacks declaring
            ``own_thread = True`` get a thread of their own besides).

    Invariant: frozen; every thread of a session reads the one instance without a lock.
    """

    barriers: frozenset[Event] = frozenset({Event.BATCH_END})
    max_lag: int = 0
    queue_size: int = 128
    warn_slow: bool = True
    close_timeout: float = DEFAULT_CLOSE_TIMEOUT
    wait_warning: float = DEFAULT_WAIT_WARNING
    lane_threads: int = DEFAULT_LANE_THREADS

    @classmethod
    def validated(
        cls,
        *,
        barriers: Iterable[Event | str] = (Event.BATCH_END,),
        max_lag: Any = 0,
        queue_size: Any = 128,
        warn_slow: Any = True,
        close_timeout: Any = DEFAULT_CLOSE_TIMEOUT,
        wait_warning: Any = DEFAULT_WAIT_WARNING,
        lane_threads: Any = DEFAULT_LANE_THREADS,
    ) -> BusOptions:
        """Check every option and return them; raise naming the argument and the fix.

        Raises:
            TypeError: An option has the wrong type.
            ValueError: An option is out of range, or a barrier names no event.
        """
        _int_at_least(max_lag, 0, "max_lag", "an int >= 0 (batches), e.g. 0 or 2")
        _int_at_least(queue_size, 1, "queue_size", "an int >= 1 (handler calls), e.g. 128")
        _int_at_least(lane_threads, 1, "lane_threads",
                      f"an int >= 1 (threads plain callbacks share), e.g. {DEFAULT_LANE_THREADS}")
        _seconds(close_timeout, "close_timeout", "30.0", " or math.inf")
        _seconds(wait_warning, "wait_warning_seconds", "10.0", ", or math.inf for never")
        if not isinstance(warn_slow, bool):
            raise TypeError(f"warn_slow_callbacks={warn_slow!r} must be True or False")
        return cls(
            barriers=frozenset(_barrier_events(barriers)),
            max_lag=max_lag,
            queue_size=queue_size,
            warn_slow=warn_slow,
            close_timeout=float(close_timeout),
            wait_warning=float(wait_warning),
            lane_threads=lane_threads,
        )


def _int_at_least(value: Any, low: int, name: str, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r} must be {what}")


def _seconds(value: Any, name: str, example: str, infinite: str) -> None:
    """Check seconds > 0 (``math.inf`` allowed); ``infinite`` says what inf means."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:  # NaN
        raise ValueError(f"{name}={value!r} must be seconds > 0, e.g. {example}{infinite}")


def _barrier_events(barriers: Iterable[Event | str]) -> list[Event]:
    hint = "use Events, e.g. barriers=(Event.BATCH_END,), or () for none but close"
    if isinstance(barriers, str | Event):
        barriers = (barriers,)
    try:
        items = list(barriers)
    except TypeError:
        raise TypeError(f"barriers={barriers!r} is not a collection of Events; {hint}") from None
    events = []
    for item in items:
        try:
            events.append(Event(item))
        except ValueError:
            valid = ", ".join(e.value for e in Event)
            raise ValueError(f"barriers={barriers!r}: {item!r} is not an Event; {hint} "
                             f"(valid names: {valid})") from None
    return events
