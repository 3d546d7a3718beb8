"""The logger callbacks write to, and the destinations that receive what they log.

``logger.log_metrics(...)`` never does I/O: it copies the values into a
:class:`LogRecord` and queues the record on every destination's lane, in order. Each
destination is a callback, so its ``log_metrics`` may be ``async def`` and runs
concurrently with training and with the other destinations.
"""

from __future__ import annotations

import inspect
import math
import operator
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from trainbus.core.callback import Callback, Handler, HandlerTable, _check_signature
from trainbus.core.handler_names import warn_uncalled_destination_methods
from trainbus.core.scalars import copy_value, resolve_value
from trainbus.core.state import _StateView
from trainbus.core.time import Time

if TYPE_CHECKING:
    from trainbus.core.state import State
    from trainbus.core.timer import Timestamp

__all__ = ["LogLevel", "LogRecord", "Logger", "LoggerDestination", "resolve_log_handler"]


class LogLevel(IntEnum):
    """How often a value is logged, as in Composer v0.6.

    Accepts names and ints: ``LogLevel("batch")``, ``LogLevel["BATCH"]``, ``LogLevel(3)``.
    """

    FIT = 1
    EPOCH = 2
    BATCH = 3
    MICROBATCH = 4

    @classmethod
    def _missing_(cls, value: object) -> LogLevel:
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        names = ", ".join(repr(level.name.lower()) for level in cls)
        raise ValueError(
            f"log level {value!r} is not a LogLevel; use one of {names} "
            f"(or its number, 1-{len(cls)}), e.g. LogLevel.BATCH"
        )


def _to_level(value: LogLevel | int | str) -> LogLevel:
    """``value`` as a :class:`LogLevel`; raises ``ValueError`` naming the valid levels."""
    if isinstance(value, LogLevel):
        return value
    if type(value) is int and value in LogLevel._value2member_map_:
        return LogLevel(value)
    return LogLevel._missing_(value)


@dataclass(slots=True)
class LogRecord:
    """One ``log_metrics`` (or ``log_hyperparameters``) call, as destinations receive it.

    Attributes:
        metrics: Names to values; tensors were copied, GPU scalars arrive as floats.
        step: The step the values belong to (default: the batch count of the event).
        wall_time: ``time.time()`` when the values were logged.
        level: The :class:`LogLevel`.
        timestamp: The run's counters when the values were logged.
        hyperparameters: Whether this record holds hyperparameters, not metrics.

    The :attr:`state` property is the state as of the event whose handler logged the
    values (a snapshot: ``state.timer``, ``state.batch``, ``state.loss``, ... are that
    event's), what a Composer ``log_data(state, log_level, data)`` receives.
    """

    metrics: dict[str, Any]
    step: int
    wall_time: float
    level: LogLevel = LogLevel.BATCH
    timestamp: Timestamp | None = None
    hyperparameters: bool = False
    _resolved: bool = field(default=False, repr=False, compare=False)
    # The logger's state and, when that is the live state, its per-batch frame then: the
    # snapshot is built only when a destination asks for it (log_data), not per record.
    _live: State | None = field(default=None, repr=False, compare=False)
    _frame: Any = field(default=None, repr=False, compare=False)

    @property
    def state(self) -> State | None:
        """The state as of the record's event (``None`` for a record built by hand)."""
        live, frame = self._live, self._frame
        if live is None or frame is None or self.timestamp is None:
            return live  # a handler's logger: its state is that event's snapshot already
        return _StateView(live, frame, self.timestamp)

    def resolve(self) -> LogRecord:
        """Turn deferred GPU scalars into floats (may wait for the device copy)."""
        if not self._resolved:
            self.metrics = {k: resolve_value(v) for k, v in self.metrics.items()}
            self._resolved = True
        return self


class _Hub:
    """What all loggers bound from one trainer share: the bus's sink, or a backlog."""

    __slots__ = ("backlog", "sink")

    def __init__(self) -> None:
        self.sink: Callable[[LogRecord], None] | None = None
        self.backlog: list[LogRecord] = []


DataArg = Mapping[str, Any] | Callable[[], Mapping[str, Any]]


#: Types whose values :func:`copy_value` returns as they are.
_PLAIN = frozenset({float, int, str, bool, type(None)})


def _copy_metrics(values: Mapping[Any, Any], call: str) -> dict[str, Any]:
    """Copies of ``values``; every key must be a ``str`` (no silent ``str(key)``)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if type(key) is str and type(value) in _PLAIN:  # most values: 4x cheaper this way
            out[key] = value
            continue
        if type(key) is not str and not isinstance(key, str):
            clash = [k for k in values if k is not key and str(k) == str(key)]
            also = (
                f"; {key!r} and {clash[0]!r} would both be named {str(key)!r}, one value lost"
                if clash else ""
            )
            raise TypeError(
                f"{call}: metric names must be str, got the key {key!r} "
                f"({type(key).__qualname__}){also}; use str keys, e.g. {{{str(key)!r}: ...}}"
            )
        out[key if type(key) is str else str(key)] = copy_value(value)  # str subclasses too
    return out


def _check_step(step: Any) -> int:
    """``step`` as an ``int``: ints (numpy's too), 0-d integer tensors, a count ``Time``."""
    if not isinstance(step, bool):
        if isinstance(step, Time) and isinstance(step.value, int):
            return step.value
        try:
            return operator.index(step)
        except TypeError:
            pass
    hint = ""
    if isinstance(step, float) and math.isfinite(step):
        hint = f" (round it yourself, e.g. step={round(step)})"
    raise TypeError(
        f"log_metrics(step={step!r}): step must be an int{hint}, "
        "or None for the batch count of the caller's event"
    )


_NO_ARTIFACTS = (
    "logger.{call}: trainbus has no artifact API (records reach each destination later, on "
    "its own lane, when the file may be gone); for checkpoint files use "
    "CheckpointSaver.add_listener(fn) or trainbus.callbacks.CheckpointUploader, for other "
    "files upload them from an `async def` handler of your callback"
)


class Logger:
    """Where callbacks log metrics; it forwards copies to every destination.

    A handler's ``logger`` argument is bound to the handler's event, so the default
    ``step`` is the batch count of that event even when the handler runs late.

    Example:
        >>> class LogLoss(Callback):
        ...     def after_loss(self, state, logger):
        ...         logger.log_metrics({"loss": state.loss})   # no .item(): no GPU sync
    """

    def __init__(self, state: State) -> None:
        self._state = state
        self._hub = _Hub()

    def _bind(self, state: State) -> Logger:
        """A logger sharing this one's destinations, with ``state`` for default steps."""
        bound = Logger.__new__(Logger)
        bound._state = state
        bound._hub = self._hub
        return bound

    def _emit(self, record: LogRecord) -> None:
        hub = self._hub
        if hub.sink is None:
            hub.backlog.append(record)
        else:
            hub.sink(record)

    def _connect(self, sink: Callable[[LogRecord], None] | None) -> list[LogRecord]:
        """Connect (or, with ``None``, disconnect) the bus.

        Returns the records logged while no bus was connected, for the bus to deliver.
        """
        self._hub.sink = sink
        backlog, self._hub.backlog = self._hub.backlog, []
        return backlog

    def log_metrics(
        self,
        metrics: Mapping[str, Any],
        step: int | None = None,
        *,
        level: LogLevel | int | str = LogLevel.BATCH,
    ) -> None:
        """Log ``metrics`` (names to numbers or tensors) at ``step``.

        Values are copied, so the caller may reuse its objects; tensors are not
        synchronised with the device here. Returns at once: destinations receive the
        values on their own lanes, in the order they were logged.

        Args:
            metrics: Names to values.
            step: The step, an ``int``; defaults to ``int(state.timer.batch)`` of the
                caller's event.
            level: The :class:`LogLevel` recorded with the values.

        Raises:
            TypeError: ``metrics`` is not a mapping, a key is not a ``str`` (the error
                names the key, and any other key it would collide with as a string), or
                ``step`` is not an ``int`` (``1.7`` is not silently truncated).
        """
        if not isinstance(metrics, Mapping):
            raise TypeError(
                f"log_metrics(metrics=...) takes a mapping of names to values, "
                f"got {type(metrics).__qualname__}; wrap the value: {{'name': value}}"
            )
        state = self._state
        ts = state.timestamp
        record = LogRecord(
            metrics=_copy_metrics(metrics, "log_metrics(metrics=...)"),
            step=int(ts.batch) if step is None else _check_step(step),
            wall_time=time.time(),
            level=_to_level(level),
            timestamp=ts,
            _live=state,
            _frame=None if isinstance(state, _StateView) else state._frame,
        )
        self._emit(record)

    def log_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        """Log the run's hyperparameters (copied) to every destination.

        Raises:
            TypeError: ``hyperparameters`` is not a mapping, or a key is not a ``str``.
        """
        if not isinstance(hyperparameters, Mapping):
            raise TypeError(
                "log_hyperparameters(...) takes a mapping of names to values, "
                f"got {type(hyperparameters).__qualname__}; e.g. {{'lr': 0.1}}"
            )
        state = self._state
        ts = state.timestamp
        self._emit(
            LogRecord(
                metrics=_copy_metrics(hyperparameters, "log_hyperparameters(...)"),
                step=int(ts.batch),
                wall_time=time.time(),
                level=LogLevel.FIT,
                timestamp=ts,
                hyperparameters=True,
                _live=state,
                _frame=None if isinstance(state, _StateView) else state._frame,
            )
        )

    @property
    def run_name(self) -> str:
        """The run's name (``Trainer(run_name=...)``), as Composer's ``logger.run_name``."""
        name: str = self._state.run_name
        return name

    def file_artifact(self, log_level: LogLevel | int | str, artifact_name: str,
                      file_path: Any, *, overwrite: bool = False) -> None:  # fmt: skip
        """Composer v0.6's artifact call; trainbus has no artifact API, so it raises.

        Raises:
            NotImplementedError: always, naming what to use instead (see
                ``docs/porting-from-composer.md``, "Logger destinations").
        """
        raise NotImplementedError(_NO_ARTIFACTS.format(call=f"file_artifact({artifact_name!r})"))

    def symlink_artifact(self, log_level: LogLevel | int | str, existing_artifact_name: str,
                         symlink_artifact_name: str, overwrite: bool = False) -> None:  # fmt: skip
        """Composer v0.6's artifact call; trainbus has no artifact API, so it raises.

        Raises:
            NotImplementedError: always, naming what to use instead.
        """
        call = f"symlink_artifact({existing_artifact_name!r}, {symlink_artifact_name!r})"
        raise NotImplementedError(_NO_ARTIFACTS.format(call=call))

    @property
    def destinations(self) -> tuple[LoggerDestination, ...]:
        """The run's logger destinations, in the order they receive records (Composer's)."""
        return tuple(cb for cb in self._state.callbacks if isinstance(cb, LoggerDestination))

    # -- Composer v0.6 API ------------------------------------------------------------------

    def data(self, log_level: LogLevel | int | str, data: DataArg) -> None:
        """Log ``data`` (a dict, or a callable returning one) at ``log_level``.

        Composer v0.6's logging call: the values are logged as :meth:`log_metrics`
        would, at the batch of the caller's event, with ``log_level`` recorded.

        Example:
            >>> logger.data("epoch", {"accuracy": 0.9})
            >>> logger.data_batch(lambda: {"lr": optimizer.param_groups[0]["lr"]})
        """
        level = _to_level(log_level)
        values = data() if callable(data) else data
        if not isinstance(values, Mapping):
            got = type(values).__qualname__
            raise TypeError(
                f"logger.data(data=...) takes a dict of names to values, or a callable "
                f"returning one; got {got}; wrap the value: {{'name': value}}"
            )
        self.log_metrics(values, level=level)

    def data_fit(self, data: DataArg) -> None:
        """Log ``data`` at :attr:`LogLevel.FIT`."""
        self.data(LogLevel.FIT, data)

    def data_epoch(self, data: DataArg) -> None:
        """Log ``data`` at :attr:`LogLevel.EPOCH`."""
        self.data(LogLevel.EPOCH, data)

    def data_batch(self, data: DataArg) -> None:
        """Log ``data`` at :attr:`LogLevel.BATCH`."""
        self.data(LogLevel.BATCH, data)


class LoggerDestination(Callback):
    """A callback that receives what is logged. Its methods may be ``async def``.

    Override :meth:`log_metrics` (and :meth:`log_hyperparameters`), or
    :meth:`log_record` for the step, wall time and level together. Records reach a
    destination in the order they were logged, on the destination's own lane, so a
    slow destination delays nobody else.

    Example:
        >>> class PrintMetrics(LoggerDestination):
        ...     def log_metrics(self, metrics, step):
        ...         print(step, metrics)
    """

    def log_metrics(self, metrics: dict[str, Any], step: int) -> Any:
        """Receive metrics logged at ``step``."""

    def log_hyperparameters(self, hyperparameters: dict[str, Any]) -> Any:
        """Receive the run's hyperparameters."""

    def log_record(self, record: LogRecord) -> Any:
        """Receive one logged record; by default calls the two methods above."""
        if record.hyperparameters:
            return self.log_hyperparameters(record.metrics)
        return self.log_metrics(record.metrics, record.step)

    def log_data(self, state: State, log_level: LogLevel, data: dict[str, Any]) -> Any:
        """Composer v0.6's entry point: override it to receive every record through it.

        Called once per logged record, in logged order, on the destination's lane (like
        :meth:`log_record`), with ``state`` as of the event whose handler logged the values
        (``record.state``), the record's :class:`LogLevel` and its values (hyperparameters
        arrive at ``LogLevel.FIT``, as Composer's ``logger.data_fit(...)``). A destination
        that overrides it gets no ``log_record``/``log_metrics``/``log_hyperparameters``
        calls. May be ``async def``.
        """


def _overrides_method(dest: LoggerDestination, name: str) -> bool:
    own = inspect.getattr_static(type(dest), name)
    return name in getattr(dest, "__dict__", {}) or own is not getattr(LoggerDestination, name)


def resolve_log_handler(table: HandlerTable) -> Handler | None:
    """For a destination, the handler that receives its log records (else ``None``).

    An overridden ``log_data`` (Composer's) gets every record as ``(record.state,
    record.level, record.metrics)``; else an overridden ``log_record`` is used as it is;
    otherwise records are routed to ``log_metrics`` / ``log_hyperparameters``, awaited if
    either is ``async def``. A method the destination defines that this leaves uncalled is
    warned about (:func:`~trainbus.core.handler_names.warn_uncalled_destination_methods`).
    """
    dest = table.callback
    if not isinstance(dest, LoggerDestination):
        return None
    cls = type(dest)
    warn_uncalled_destination_methods(dest, LoggerDestination)
    if _overrides_method(dest, "log_data"):
        _check_signature(dest, "log_data", 3, "log_data(self, state, log_level, data)")
        log_data = dest.log_data
        data_async = inspect.iscoroutinefunction(log_data)
        if data_async:

            async def deliver_async(record: LogRecord) -> None:
                await log_data(record.state, record.level, record.metrics)  # type: ignore[arg-type]

            data_fn: Callable[[LogRecord], Any] = deliver_async
        else:

            def deliver(record: LogRecord) -> Any:
                return log_data(record.state, record.level, record.metrics)  # type: ignore[arg-type]

            data_fn = deliver
        return Handler(dest, f"{cls.__qualname__}.log_data", data_fn, data_async, False)
    if cls.log_record is not LoggerDestination.log_record:
        method = dest.log_record
        fn: Callable[..., Any] = method
        is_async = inspect.iscoroutinefunction(method)
    else:
        metrics, hparams = dest.log_metrics, dest.log_hyperparameters
        m_async = inspect.iscoroutinefunction(metrics)
        h_async = inspect.iscoroutinefunction(hparams)
        is_async = m_async or h_async
        if is_async:

            async def route(record: LogRecord) -> None:
                if record.hyperparameters:
                    result = hparams(record.metrics)
                    if h_async:
                        await result
                else:
                    result = metrics(record.metrics, record.step)
                    if m_async:
                        await result

            fn = route
        else:
            fn = dest.log_record
    return Handler(dest, f"{cls.__qualname__}.log_record", fn, is_async, False)


# Shown as ``trainbus.X`` in tracebacks and reprs (each is exported there; pickling works).
LogLevel.__module__ = "trainbus"
LogRecord.__module__ = "trainbus"
Logger.__module__ = "trainbus"
LoggerDestination.__module__ = "trainbus"
