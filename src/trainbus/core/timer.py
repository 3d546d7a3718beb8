"""The training counters: the mutable :class:`Timer` and its immutable :class:`Timestamp`.

The training loop advances one :class:`Timer`; every change replaces its current
:class:`Timestamp`, an immutable snapshot that a handler may keep (or read from another
thread) while training goes on, so taking a snapshot is one reference (D5).

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
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, SupportsIndex, overload

from trainbus.core.time import Time, TimeUnit, _new_time, _to_unit

__all__ = ("Timer", "Timestamp")


_FIELD_UNITS = {
    "epoch": "ep", "batch": "ba", "batch_in_epoch": "ba", "sample": "sp",
    "sample_in_epoch": "sp", "token": "tok", "token_in_epoch": "tok",
}  # fmt: skip
_FIELDS = tuple(_FIELD_UNITS)
_UNITS = tuple(TimeUnit(unit) for unit in _FIELD_UNITS.values())


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

    It follows the ``NamedTuple`` protocol of Composer's Timestamp without being a
    ``tuple``: ``_fields``, ``_asdict()``, ``_replace()``, ``_make()``, ``len()``, iteration
    and indexing give the seven counters as :class:`Time` values, in the order of
    ``_fields``.

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

    # -- the NamedTuple protocol, as Composer's Timestamp ------------------------------------
    # Read-only methods over the slots: building a Timestamp costs what it did (the training
    # thread builds one a batch), and code written for Composer's NamedTuple works.

    #: The counters' names, in order (``NamedTuple._fields``).
    _fields: tuple[str, ...] = _FIELDS

    def _asdict(self) -> dict[str, Time[int]]:
        """The counters by name, as :class:`Time` values (``NamedTuple._asdict``)."""
        return dict(zip(_FIELDS, self, strict=True))

    def _replace(self, **changes: int | Time[int]) -> Timestamp:
        """:meth:`copy` under ``NamedTuple``'s name."""
        return self.copy(**changes)

    @classmethod
    def _make(cls, counters: Iterable[int | Time[int]]) -> Timestamp:
        """A Timestamp from the seven counters in :attr:`_fields` order."""
        values = list(counters)
        if len(values) != len(_FIELDS):
            raise TypeError(
                f"Timestamp._make takes {len(_FIELDS)} counters ({', '.join(_FIELDS)}), "
                f"got {len(values)}"
            )
        return cls(**dict(zip(_FIELDS, values, strict=True)))

    def __len__(self) -> int:
        return len(_FIELDS)

    def __iter__(self) -> Iterator[Time[int]]:
        """The counters as :class:`Time` values, in :attr:`_fields` order."""
        for value, unit in zip(self._key(), _UNITS, strict=True):
            yield _new_time(value, unit)

    @overload
    def __getitem__(self, index: SupportsIndex) -> Time[int]: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Time[int], ...]: ...
    def __getitem__(self, index: SupportsIndex | slice) -> Time[int] | tuple[Time[int], ...]:
        if isinstance(index, slice):
            return tuple(self)[index]
        i = operator.index(index)
        return _new_time(self._key()[i], _UNITS[i])

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
