"""Training time: units, durations, immutable timestamps and the mutable timer.

A :class:`Time` is a value with a :class:`TimeUnit` ("10ba", "1ep", "0.5dur"). The
training loop advances one :class:`Timer`; every change replaces its current
:class:`Timestamp`, an immutable snapshot that a handler may keep (or read from
another thread) while training goes on.

Example:
    >>> timer = Timer()
    >>> timer.on_batch_complete(samples=32)
    >>> snapshot = timer.snapshot()
    >>> timer.on_epoch_complete()
    >>> snapshot.batch_in_epoch, timer.batch_in_epoch
    (Time(1, TimeUnit.BATCH), Time(0, TimeUnit.BATCH))
    >>> timer >= Time.from_timestring("1ep")
    True
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from enum import StrEnum
from typing import Any, Generic, NoReturn, TypeVar, overload

__all__ = ("TimeUnit", "Time", "Timestamp", "Timer", "ensure_time")

TValue = TypeVar("TValue", int, float, covariant=True)
_N = TypeVar("_N", int, float)

_UNITS_HELP = "ep, ba, sp, tok, dur"
_EXAMPLES = "e.g. '1ep', '10ba', '100sp', '1000tok' or '0.5dur'"
_NUMBER_UNIT_RE = re.compile(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)")
_set = object.__setattr__


class TimeUnit(StrEnum):
    """Units of training time; each value is the suffix used in time strings.

    Example:
        >>> TimeUnit("ba")
        <TimeUnit.BATCH: 'ba'>
        >>> str(TimeUnit.EPOCH)
        'ep'
    """

    EPOCH = "ep"
    BATCH = "ba"
    SAMPLE = "sp"
    TOKEN = "tok"
    DURATION = "dur"


_COUNT_NAMES = {"ep": "epochs", "ba": "batches", "sp": "samples", "tok": "tokens"}


def _to_unit(unit: object) -> TimeUnit:
    if isinstance(unit, TimeUnit):
        return unit
    if not isinstance(unit, str):
        raise TypeError(f"time unit must be a TimeUnit or one of {_UNITS_HELP}, got {unit!r}")
    try:
        return TimeUnit(unit.strip().lower())
    except ValueError:
        raise ValueError(f"invalid time unit {unit!r}: expected one of {_UNITS_HELP}") from None


def _new_time(value: _N, unit: TimeUnit) -> Time[_N]:
    """Build a Time without validation (hot path for counters and arithmetic)."""
    time: Time[_N] = object.__new__(Time)
    _set(time, "_value", value)
    _set(time, "_unit", unit)
    return time


def _bad_timestring(timestring: str, reason: str) -> NoReturn:
    raise ValueError(
        f"invalid time string {timestring!r}: {reason}; a time string is a non-negative "
        f"number followed by one of the units {_UNITS_HELP} ({_EXAMPLES})"
    )


class Time(Generic[TValue]):
    """An amount of training time: a number and a :class:`TimeUnit`.

    Times are immutable and hashable. ``+``, ``-`` and comparisons need the same unit
    (a plain number is read in the other operand's unit); ``*`` and ``/`` take a number;
    ``Time / Time`` of one unit is their float ratio. Mixing units raises ``TypeError``.
    ``Time == number`` compares the value, so ``timer.epoch == 0`` works; the hash of a
    Time is only consistent with equality between Times.

    Args:
        value: The amount, an ``int`` (or a ``float``, for durations).
        unit: A :class:`TimeUnit` or its string value, e.g. ``"ba"``.

    Example:
        >>> t = Time(10, "ba")
        >>> t, str(t), t + 5, t * 2, t / Time(4, "ba")
        (Time(10, TimeUnit.BATCH), '10ba', Time(15, TimeUnit.BATCH), Time(20, TimeUnit.BATCH), 2.5)
        >>> t == 10, t < Time.from_batch(11)
        (True, True)
    """

    __slots__ = ("_unit", "_value")
    _value: TValue
    _unit: TimeUnit

    def __init__(self, value: TValue, unit: TimeUnit | str) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"Time value must be an int or a float, got {value!r}")
        _set(self, "_value", value)
        _set(self, "_unit", _to_unit(unit))

    @property
    def value(self) -> TValue:
        """The amount of time, in :attr:`unit`."""
        return self._value

    @property
    def unit(self) -> TimeUnit:
        """The unit of :attr:`value`."""
        return self._unit

    @classmethod
    def from_epoch(cls, epoch: int) -> Time[int]:
        """A number of epochs, e.g. ``Time.from_epoch(2) == Time(2, "ep")``."""
        return Time(epoch, TimeUnit.EPOCH)

    @classmethod
    def from_batch(cls, batch: int) -> Time[int]:
        """A number of batches (optimizer steps)."""
        return Time(batch, TimeUnit.BATCH)

    @classmethod
    def from_sample(cls, sample: int) -> Time[int]:
        """A number of samples."""
        return Time(sample, TimeUnit.SAMPLE)

    @classmethod
    def from_token(cls, token: int) -> Time[int]:
        """A number of tokens."""
        return Time(token, TimeUnit.TOKEN)

    @classmethod
    def from_duration(cls, duration: float) -> Time[float]:
        """A fraction of the whole run, e.g. ``0.5`` for halfway."""
        return Time(float(duration), TimeUnit.DURATION)

    @classmethod
    def from_timestring(cls, timestring: str) -> Time[Any]:
        """Parse a time string such as ``"10ba"``, ``"3e4tok"`` or ``"0.5dur"``.

        Counts (``ep``, ``ba``, ``sp``, ``tok``) must be whole non-negative numbers and give
        an ``int`` value; ``dur`` gives a non-negative ``float``.

        Raises:
            ValueError: The string is not a number followed by a valid unit.
            TypeError: ``timestring`` is not a ``str``.

        Example:
            >>> Time.from_timestring(" 3e4tok ")
            Time(30000, TimeUnit.TOKEN)
            >>> Time.from_timestring("0.5dur")
            Time(0.5, TimeUnit.DURATION)
        """
        if not isinstance(timestring, str):
            raise TypeError(f"a time string must be a str such as '10ba', got {timestring!r}")
        match = _NUMBER_UNIT_RE.fullmatch(timestring.strip())
        if match is None:
            _bad_timestring(timestring, "expected a number followed by a unit")
        number, suffix = match[1], match[2].lower()
        if not suffix:
            _bad_timestring(timestring, "the unit is missing")
        if suffix not in TimeUnit._value2member_map_:
            _bad_timestring(timestring, f"unknown unit {match[2]!r}")
        unit, amount = TimeUnit(suffix), Decimal(number)
        if amount < 0:
            _bad_timestring(timestring, "time cannot be negative")
        if amount.adjusted() > 30:
            _bad_timestring(timestring, "the number is too large")
        if unit is TimeUnit.DURATION:
            return Time(float(amount), unit)
        if amount != amount.to_integral_value():
            _bad_timestring(
                timestring,
                f"{unit.value!r} counts whole {_COUNT_NAMES[unit]}; use an integer, "
                "or 'dur' for a fraction of the run",
            )
        return Time(int(amount), unit)

    def to_timestring(self) -> str:
        """The time string that :meth:`from_timestring` parses back, e.g. ``"10ba"``."""
        return f"{self._value}{self._unit.value}"

    def _operand(self, other: object, verb: str = "") -> int | float | None:
        """The value of a number, or of a Time of this unit when ``verb`` names the operation."""
        if verb and isinstance(other, Time):
            if other._unit is not self._unit:
                raise TypeError(
                    f"cannot {verb} {self!r} and {other!r}: their units differ "
                    f"({self._unit.value} and {other._unit.value}); use Times of one unit"
                )
            value: int | float = other._value
            return value
        if isinstance(other, int | float) and not isinstance(other, bool):
            return other
        return None

    @overload
    def __add__(self: Time[int], other: Time[int] | int) -> Time[int]: ...
    @overload
    def __add__(self, other: Time[float] | float) -> Time[float]: ...
    def __add__(self, other: object) -> Time[Any]:
        value = self._operand(other, "add")
        return NotImplemented if value is None else _new_time(self._value + value, self._unit)

    __radd__ = __add__

    @overload
    def __sub__(self: Time[int], other: Time[int] | int) -> Time[int]: ...
    @overload
    def __sub__(self, other: Time[float] | float) -> Time[float]: ...
    def __sub__(self, other: object) -> Time[Any]:
        value = self._operand(other, "subtract")
        return NotImplemented if value is None else _new_time(self._value - value, self._unit)

    @overload
    def __rsub__(self: Time[int], other: int) -> Time[int]: ...
    @overload
    def __rsub__(self, other: float) -> Time[float]: ...
    def __rsub__(self, other: object) -> Time[Any]:
        value = self._operand(other)
        return NotImplemented if value is None else _new_time(value - self._value, self._unit)

    @overload
    def __mul__(self: Time[int], other: int) -> Time[int]: ...
    @overload
    def __mul__(self, other: float) -> Time[float]: ...
    def __mul__(self, other: object) -> Time[Any]:
        value = self._operand(other)
        return NotImplemented if value is None else _new_time(self._value * value, self._unit)

    __rmul__ = __mul__

    @overload
    def __truediv__(self, other: Time[float]) -> float: ...
    @overload
    def __truediv__(self, other: float) -> Time[float]: ...
    def __truediv__(self, other: object) -> Time[float] | float:
        if isinstance(other, Time):
            ratio = self._operand(other, "divide")
            assert ratio is not None
            return self._value / ratio
        value = self._operand(other)
        return NotImplemented if value is None else _new_time(self._value / value, self._unit)

    def _compare(self, other: object, op: Callable[[Any, Any], bool]) -> bool:
        value = self._operand(other, "compare")
        return NotImplemented if value is None else op(self._value, value)

    def __eq__(self, other: object) -> bool:
        return self._compare(other, operator.eq)

    def __lt__(self, other: object) -> bool:
        return self._compare(other, operator.lt)

    def __le__(self, other: object) -> bool:
        return self._compare(other, operator.le)

    def __gt__(self, other: object) -> bool:
        return self._compare(other, operator.gt)

    def __ge__(self, other: object) -> bool:
        return self._compare(other, operator.ge)

    def __hash__(self) -> int:
        return hash((self._value, self._unit))

    def __int__(self) -> int:
        return int(self._value)

    def __float__(self) -> float:
        return float(self._value)

    def __repr__(self) -> str:
        return f"Time({self._value!r}, TimeUnit.{self._unit.name})"

    def __str__(self) -> str:
        return self.to_timestring()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Time is immutable; build a new one instead of setting {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Time is immutable; cannot delete {name!r}")

    def __reduce__(self) -> tuple[type[Time[Any]], tuple[int | float, TimeUnit]]:
        return (Time, (self._value, self._unit))


def ensure_time(value: Time[Any] | str | int, *, name: str = "duration") -> Time[Any]:
    """Convert a user-supplied duration to a :class:`Time`.

    Args:
        value: A :class:`Time`, a time string (``"10ba"``) or an ``int`` number of epochs.
        name: The argument's name, used in error messages (e.g. ``"max_duration"``).

    Raises:
        ValueError: A bad time string or a negative amount.
        TypeError: Any other type (``bool`` and ``float`` included).

    Example:
        >>> ensure_time(3), ensure_time("500ba")
        (Time(3, TimeUnit.EPOCH), Time(500, TimeUnit.BATCH))
    """
    hint = "pass a Time, a time string such as '10ep' or '500ba', or an int number of epochs"
    if isinstance(value, Time):
        if value.value < 0:
            raise ValueError(f"{name} must not be negative, got {value!r}; {hint}")
        return value
    if isinstance(value, str):
        try:
            return Time.from_timestring(value)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        extra = " (use '0.5dur' for a fraction of the run)" if isinstance(value, float) else ""
        raise TypeError(f"{name} must be a Time, a str or an int, got {value!r}; {hint}{extra}")
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}; {hint}")
    return Time(value, TimeUnit.EPOCH)


_FIELD_UNITS = {
    "epoch": "ep", "batch": "ba", "batch_in_epoch": "ba", "sample": "sp",
    "sample_in_epoch": "sp", "token": "tok", "token_in_epoch": "tok",
}  # fmt: skip
_FIELDS = tuple(_FIELD_UNITS)


def _count(name: str, value: object, unit: str) -> int:
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, Time):
        if value.unit != unit or not isinstance(value.value, int):
            raise ValueError(f"{name} must be an int or a Time in {unit!r}, got {value!r}")
        value = value.value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}")
    return value


class _Counters:
    """Read API shared by Timestamp and Timer: counters as Times, get() and comparisons."""

    __slots__ = ()

    def get_timestamp(self) -> Timestamp:
        raise NotImplementedError

    @property
    def epoch(self) -> Time[int]:
        """Completed epochs."""
        return _new_time(self.get_timestamp()._epoch, TimeUnit.EPOCH)

    @property
    def batch(self) -> Time[int]:
        """Completed batches over the whole run."""
        return _new_time(self.get_timestamp()._batch, TimeUnit.BATCH)

    @property
    def batch_in_epoch(self) -> Time[int]:
        """Completed batches in the current epoch."""
        return _new_time(self.get_timestamp()._batch_in_epoch, TimeUnit.BATCH)

    @property
    def sample(self) -> Time[int]:
        """Samples seen over the whole run."""
        return _new_time(self.get_timestamp()._sample, TimeUnit.SAMPLE)

    @property
    def sample_in_epoch(self) -> Time[int]:
        """Samples seen in the current epoch."""
        return _new_time(self.get_timestamp()._sample_in_epoch, TimeUnit.SAMPLE)

    @property
    def token(self) -> Time[int]:
        """Tokens seen over the whole run."""
        return _new_time(self.get_timestamp()._token, TimeUnit.TOKEN)

    @property
    def token_in_epoch(self) -> Time[int]:
        """Tokens seen in the current epoch."""
        return _new_time(self.get_timestamp()._token_in_epoch, TimeUnit.TOKEN)

    def get(self, unit: TimeUnit | str) -> Time[int]:
        """The run-wide counter for ``unit`` (``ep``, ``ba``, ``sp`` or ``tok``)."""
        unit = _to_unit(unit)
        ts = self.get_timestamp()
        if unit is TimeUnit.DURATION:
            raise ValueError(
                "a timestamp has no 'dur' counter; divide a counter by max_duration, "
                "e.g. timestamp.get(max_duration.unit) / max_duration"
            )
        value = {"ep": ts._epoch, "ba": ts._batch, "sp": ts._sample, "tok": ts._token}[unit]
        return _new_time(value, unit)

    def __eq__(self, other: object) -> bool:
        return self.get(other.unit) == other if isinstance(other, Time) else NotImplemented

    def __lt__(self, other: object) -> bool:
        return self.get(other.unit) < other if isinstance(other, Time) else NotImplemented

    def __le__(self, other: object) -> bool:
        return self.get(other.unit) <= other if isinstance(other, Time) else NotImplemented

    def __gt__(self, other: object) -> bool:
        return self.get(other.unit) > other if isinstance(other, Time) else NotImplemented

    def __ge__(self, other: object) -> bool:
        return self.get(other.unit) >= other if isinstance(other, Time) else NotImplemented

    def state_dict(self) -> dict[str, int]:
        """The seven counters as plain ints, keyed by name."""
        ts = self.get_timestamp()
        return {name: getattr(ts, "_" + name) for name in _FIELDS}

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v}" for k, v in self.state_dict().items())
        return f"{type(self).__name__}({fields})"


class Timestamp(_Counters):
    """An immutable snapshot of the training counters, cheap to create and to share.

    Counters are read as :class:`Time` properties; comparing a Timestamp with a Time
    compares the run-wide counter of that unit. Two Timestamps are equal when all their
    counters are.

    Args:
        epoch, batch, batch_in_epoch, sample, sample_in_epoch, token, token_in_epoch:
            Non-negative ints (or Times of the matching unit); keyword-only.

    Example:
        >>> ts = Timestamp(epoch=1, batch=3, batch_in_epoch=1)
        >>> ts.batch, ts >= Time(1, "ep"), ts.copy(batch=4).batch
        (Time(3, TimeUnit.BATCH), True, Time(4, TimeUnit.BATCH))
    """

    __slots__ = tuple("_" + name for name in _FIELDS)
    _epoch: int
    _batch: int
    _batch_in_epoch: int
    _sample: int
    _sample_in_epoch: int
    _token: int
    _token_in_epoch: int

    def __init__(
        self,
        *,
        epoch: int | Time[int] = 0,
        batch: int | Time[int] = 0,
        batch_in_epoch: int | Time[int] = 0,
        sample: int | Time[int] = 0,
        sample_in_epoch: int | Time[int] = 0,
        token: int | Time[int] = 0,
        token_in_epoch: int | Time[int] = 0,
    ) -> None:
        given = (epoch, batch, batch_in_epoch, sample, sample_in_epoch, token, token_in_epoch)
        for setter, name, value in zip(_SETTERS, _FIELDS, given, strict=True):
            setter(self, _count(name, value, _FIELD_UNITS[name]))

    def get_timestamp(self) -> Timestamp:
        """This timestamp (so Timestamp and Timer share one read API)."""
        return self

    def copy(self, **changes: int | Time[int]) -> Timestamp:
        """A new Timestamp with some counters replaced, e.g. ``ts.copy(batch=0)``."""
        return Timestamp(**{**self.state_dict(), **changes})

    def _key(self) -> tuple[int, ...]:
        return (self._epoch, self._batch, self._batch_in_epoch, self._sample,
                self._sample_in_epoch, self._token, self._token_in_epoch)  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Timestamp):
            return self._key() == other._key()
        return super().__eq__(other)

    def __hash__(self) -> int:
        return hash(self._key())

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Timestamp is immutable; use timestamp.copy({name}=...)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Timestamp is immutable; cannot delete {name!r}")

    def __reduce__(self) -> tuple[Any, tuple[int, ...]]:
        return (_make_timestamp, self._key())


def _make_timestamp(
    epoch: int, batch: int, batch_in_epoch: int, sample: int,
    sample_in_epoch: int, token: int, token_in_epoch: int,
) -> Timestamp:  # fmt: skip
    """Build a Timestamp from trusted ints, without validation (the Timer's hot path)."""
    ts: Timestamp = _new(Timestamp)
    _set_epoch(ts, epoch)
    _set_batch(ts, batch)
    _set_batch_in_epoch(ts, batch_in_epoch)
    _set_sample(ts, sample)
    _set_sample_in_epoch(ts, sample_in_epoch)
    _set_token(ts, token)
    _set_token_in_epoch(ts, token_in_epoch)
    return ts


# Slot descriptors' setters bypass Timestamp.__setattr__ (faster than object.__setattr__).
_new = object.__new__
_SETTERS: tuple[Callable[[Timestamp, int], None], ...] = tuple(
    vars(Timestamp)["_" + name].__set__ for name in _FIELDS
)
(_set_epoch, _set_batch, _set_batch_in_epoch, _set_sample,
 _set_sample_in_epoch, _set_token, _set_token_in_epoch) = _SETTERS  # fmt: skip
_ZERO = _make_timestamp(0, 0, 0, 0, 0, 0, 0)


class Timer(_Counters):
    """The training clock: mutable counters that the training loop advances.

    Each change replaces the current :class:`Timestamp`, so :meth:`snapshot` is O(1) and a
    snapshot never changes after it is taken. Reads and comparisons work as on a
    Timestamp; two Timers are equal only if they are the same object.

    Args:
        timestamp: The starting counters (default: all zero).

    Example:
        >>> timer = Timer()
        >>> timer.on_batch_complete(samples=64, tokens=1000)
        >>> int(timer.batch), timer.sample, timer >= Time(1, "ba")
        (1, Time(64, TimeUnit.SAMPLE), True)
    """

    __slots__ = ("__weakref__", "_ts")

    def __init__(self, timestamp: Timestamp | None = None) -> None:
        self._ts = _ZERO if timestamp is None else timestamp

    def get_timestamp(self) -> Timestamp:
        """The current counters as an immutable :class:`Timestamp`."""
        return self._ts

    def snapshot(self) -> Timestamp:
        """The current counters as an immutable :class:`Timestamp` (same as get_timestamp)."""
        return self._ts

    def on_batch_complete(self, samples: int | Time[int] = 0, tokens: int | Time[int] = 0) -> None:
        """Count one finished batch with its ``samples`` and ``tokens``."""
        n_samples = _count("samples", samples, "sp")
        n_tokens = _count("tokens", tokens, "tok")
        ts = self._ts
        self._ts = _make_timestamp(
            ts._epoch, ts._batch + 1, ts._batch_in_epoch + 1,
            ts._sample + n_samples, ts._sample_in_epoch + n_samples,
            ts._token + n_tokens, ts._token_in_epoch + n_tokens,
        )  # fmt: skip

    def on_epoch_complete(self) -> None:
        """Count one finished epoch and reset the ``*_in_epoch`` counters."""
        ts = self._ts
        self._ts = _make_timestamp(ts._epoch + 1, ts._batch, 0, ts._sample, 0, ts._token, 0)

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Restore counters from :meth:`state_dict` (missing keys count as zero)."""
        unknown = sorted(set(state) - set(_FIELDS))
        if unknown:
            raise ValueError(f"unknown Timer state keys {unknown}; expected {', '.join(_FIELDS)}")
        self._ts = Timestamp(**state)

    def reset(self) -> None:
        """Set every counter back to zero."""
        self._ts = _ZERO

    def __hash__(self) -> int:
        return object.__hash__(self)
