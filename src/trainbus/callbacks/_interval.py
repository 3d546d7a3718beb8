"""When a periodic callback acts: ``"10ba"``, ``"1ep"``, ``"500sp"``, ``"0.25dur"`` or an int.

Periodic built-ins (``MemoryMonitor``, ``ProgressBar``'s plain lines, ...) take an
``interval`` and ask an :class:`Interval` at each ``BATCH_END`` and ``EPOCH_END``
whether the event's timestamp is due. The decision reads only the handler's snapshot
(its timestamp and batch size), so it is right even when the handler runs late, and it
needs no memory of earlier calls, so it is also right after resuming from a checkpoint.

An event is due when its counter crossed a multiple of the interval during the step
that led to it: epochs are checked at ``EPOCH_END``; batches, samples and tokens at
``BATCH_END``; a fraction of the run (``dur``) is converted to the unit of
``max_duration`` and checked at that unit's event.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

from trainbus.core.events import Event
from trainbus.core.time import Time, TimeUnit, ensure_time

if TYPE_CHECKING:
    from trainbus.core.state import State

__all__ = ["Interval"]


class Interval:
    """A period of training time, and the test of whether an event is due.

    Args:
        interval: A :class:`~trainbus.Time`, a time string (``"10ba"``, ``"1ep"``,
            ``"1000sp"``, ``"0.1dur"``) or an int number of epochs. Must be positive;
            a ``dur`` fraction must be at most 1.
        name: The argument's name in the caller's signature, for error messages.

    Raises:
        ValueError: A bad time string, zero, or a fraction above ``1dur``.
        TypeError: Neither a Time, a str nor an int.

    Example:
        >>> every = Interval("2ba")
        >>> class Hello(Callback):
        ...     def batch_end(self, state, logger):
        ...         if every.is_due(Event.BATCH_END, state):
        ...             print("batch", int(state.timer.batch))   # batches 2, 4, 6, ...
    """

    __slots__ = ("time",)

    time: Time[Any]

    def __init__(self, interval: Time[Any] | str | int, *, name: str = "interval") -> None:
        value = ensure_time(interval, name=name)
        if value.value <= 0:
            raise ValueError(
                f"{name}={interval!r} must be positive; use e.g. '10ba', '1ep' or 1 (epochs)"
            )
        if value.unit is TimeUnit.DURATION and value.value > 1:
            raise ValueError(
                f"{name}={interval!r} is more than the whole run; use a fraction in (0, 1], "
                "e.g. '0.1dur'"
            )
        self.time = value

    def unit_for(self, state: State) -> TimeUnit:
        """The counter the interval is measured on (``dur`` takes ``max_duration``'s)."""
        unit = self.time.unit
        return state.max_duration.unit if unit is TimeUnit.DURATION else unit

    def event_for(self, state: State) -> Event:
        """The event at which :meth:`is_due` can answer yes: ``EPOCH_END`` or ``BATCH_END``."""
        return Event.EPOCH_END if self.unit_for(state) is TimeUnit.EPOCH else Event.BATCH_END

    def _period(self, state: State) -> int | Fraction:
        value = self.time.value
        if self.time.unit is not TimeUnit.DURATION:
            return int(value)
        return Fraction(str(value)) * int(state.max_duration.value)

    def is_due(self, event: Event, state: State) -> bool:
        """Whether ``event`` (with the handler's ``state``) falls on the interval.

        True when the event is the one the interval's unit is checked at (see
        :meth:`event_for`) and the counter crossed a multiple of the period during the
        batch (or epoch) that just ended. For batches and epochs this is
        ``count % every == 0``; for samples and tokens a batch that steps over a
        multiple counts, even if it does not land on it.
        """
        unit = self.unit_for(state)
        ts = state.timestamp
        if unit is TimeUnit.EPOCH:
            if event is not Event.EPOCH_END:
                return False
            count, step = int(ts.epoch), 1
        else:
            if event is not Event.BATCH_END:
                return False
            if unit is TimeUnit.BATCH:
                count, step = int(ts.batch), 1
            elif unit is TimeUnit.SAMPLE:
                count, step = int(ts.sample), int(state.batch_num_samples)
            else:
                count, step = int(ts.token), int(state.batch_num_tokens)
        if step <= 0:
            return False
        period = self._period(state)
        if period <= 0:  # a 'dur' interval of an empty run
            return False
        return count // period > (count - step) // period

    def __repr__(self) -> str:
        return f"Interval({self.time.to_timestring()!r})"
