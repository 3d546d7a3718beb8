"""Training time: units and durations (``"10ba"``, ``"1ep"``, ``"0.5dur"``).

A :class:`Time` is a value with a :class:`TimeUnit`. The counters that the training loop
advances, :class:`~trainbus.Timer` and its immutable :class:`~trainbus.Timestamp`, are in
``_timer.py``.

Example:
    >>> Time.from_timestring("10ba") + 5
    Time(15, TimeUnit.BATCH)
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from decimal import Decimal
from enum import StrEnum
from typing import Any, Generic, NoReturn, TypeVar, overload

__all__ = ("Time", "TimeUnit", "ensure_time")

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


def _checked_float(value: float, unit: TimeUnit) -> float | int:
    """A float Time value: finite; a whole ``int`` for counts (``"1.5ep"`` is refused too)."""
    if not math.isfinite(value):
        raise ValueError(
            f"Time({value!r}, {unit.value!r}): the value must be a finite number, {_EXAMPLES}"
        )
    if unit is TimeUnit.DURATION:
        return value
    if not value.is_integer():
        raise ValueError(
            f"Time({value!r}, {unit.value!r}): {unit.value!r} counts whole "
            f"{_COUNT_NAMES[unit]}; use an int such as Time({math.floor(value)}, "
            f"{unit.value!r}), or Time(0.5, 'dur') for a fraction of the run"
        )
    return int(value)


def _bad_timestring(timestring: str, reason: str) -> NoReturn:
    raise ValueError(
        f"invalid time string {timestring!r}: {reason}; a time string is a non-negative "
        f"number followed by one of the units {_UNITS_HELP} ({_EXAMPLES})"
    )


class Time(Generic[TValue]):
    """An amount of training time: a number and a :class:`TimeUnit`.

    Times are immutable and hashable. ``+``, ``-`` and ordering (``<``, ``<=``, ...) need
    the same unit (a plain number is read in the other operand's unit); unary ``-``, ``+``
    and ``abs()`` keep the unit; ``*`` and ``/``
    take a number; ``Time / Time`` of one unit is their float ratio. Mixing units in
    arithmetic or ordering raises ``TypeError``; ``==`` between Times of different units
    is ``False`` (``Time(1, "ep") == Time(3, "ba")`` cannot be known without the loader),
    so Times of mixed units can share a set or a dict. ``Time == number`` compares the
    value, so ``timer.epoch == 0`` works; the hash of a Time is only consistent with
    equality between Times.

    Counts (``ep``, ``ba``, ``sp``, ``tok``) are whole numbers, as in time strings
    (``"1.5ep"`` is rejected): ``Time(1.5, "ep")`` raises ``ValueError`` (use an ``int``,
    or ``Time(0.5, "dur")`` for a fraction of the run); a whole float such as ``3.0``
    becomes the ``int`` ``3``. Arithmetic on Times (``Time(3, "ba") / 2``) may still
    give a fractional value. NaN and infinities are rejected in every unit.

    Args:
        value: The amount, an ``int`` (or a ``float``, for durations).
        unit: A :class:`TimeUnit` or its string value, e.g. ``"ba"``.

    Raises:
        TypeError: ``value`` is not an ``int`` or a ``float`` (``bool`` included).
        ValueError: ``value`` is not finite, or is a fractional count; or ``unit`` is
            not a unit.

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
        time_unit = _to_unit(unit)
        if isinstance(value, float):
            _set(self, "_unit", time_unit)
            _set(self, "_value", _checked_float(value, time_unit))
            return
        _set(self, "_value", value)
        _set(self, "_unit", time_unit)

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

    def __neg__(self) -> Time[TValue]:
        """``-Time(3, "ba")`` is ``Time(-3, "ba")`` (as in Composer; e.g. for differences)."""
        return _new_time(-self._value, self._unit)

    def __pos__(self) -> Time[TValue]:
        """``+time`` is ``time`` itself."""
        return self

    def __abs__(self) -> Time[TValue]:
        """``abs(Time(-3, "ba"))`` is ``Time(3, "ba")``."""
        return self if self._value >= 0 else -self

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
        if isinstance(other, Time) and other._unit is not self._unit:
            return False  # different units are never equal (unknowable without the loader)
        return self._compare(other, operator.eq)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

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
        ValueError: A bad time string, a negative or non-finite amount, or a fractional
            count (``Time(2, "ep") * 0.25``).
        TypeError: Any other type (``bool`` and ``float`` included).

    Example:
        >>> ensure_time(3), ensure_time("500ba")
        (Time(3, TimeUnit.EPOCH), Time(500, TimeUnit.BATCH))
    """
    hint = "pass a Time, a time string such as '10ep' or '500ba', or an int number of epochs"
    if isinstance(value, Time):
        amount = value.value
        if not math.isfinite(amount):
            raise ValueError(f"{name} must be finite, got {value!r}; {hint}")
        if amount < 0:
            raise ValueError(f"{name} must not be negative, got {value!r}; {hint}")
        if value.unit is not TimeUnit.DURATION and amount != int(amount):
            raise ValueError(
                f"{name}={value!r} is a fractional count of {_COUNT_NAMES[value.unit]}; "
                f"use a whole number, or a fraction of the run such as '0.5dur'"
            )
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


# Shown as ``trainbus.X`` in tracebacks and reprs (each is exported there; pickling works).
Time.__module__ = "trainbus"
TimeUnit.__module__ = "trainbus"
