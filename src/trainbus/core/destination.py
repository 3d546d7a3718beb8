"""Logger destinations: the callbacks that receive what is logged, and how records reach them.

A destination overrides Composer v0.6's ``log_data``, or ``log_record``, or ``log_metrics`` /
``log_hyperparameters``; :func:`resolve_log_handler` picks, once per destination, the one
handler the bus calls with each record on the destination's lane.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from trainbus.core.backpressure import Backpressure
from trainbus.core.callback import Callback, Handler, HandlerTable, _check_signature
from trainbus.core.handler_names import warn_uncalled_destination_methods
from trainbus.core.logger import LogLevel, LogRecord, _to_level

if TYPE_CHECKING:
    from trainbus.core.state import State

__all__ = ["LoggerDestination", "resolve_log_handler"]


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

    #: Marks a destination for :attr:`Logger.destinations <trainbus.Logger.destinations>`.
    _receives_records: ClassVar[bool] = True
    #: What happens when it falls behind (``docs/loggers.md``, "Falling behind"); ``None``
    #: is :meth:`Backpressure.block() <trainbus.Backpressure.block>`. Set on the class or
    #: on the instance before the trainer is built.
    backpressure: Backpressure | None = None
    #: Why a destination takes only ``block`` (it promises every point); else ``None``.
    _refuses_lossy: ClassVar[str | None] = None

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

        Not overridden, calling it (as Composer's own tests do) records what
        :meth:`log_record` would: a :class:`LogRecord` of ``data`` at ``log_level``, with
        ``state``'s timestamp and its batch count as the step. For a destination whose
        ``log_record`` is ``async def`` it returns that coroutine: await it.

        Example:
            >>> memory = InMemoryLogger()
            >>> memory.log_data(trainer.state, LogLevel.BATCH, {"loss": 0.5})
            >>> memory.most_recent_values["loss"]
            0.5

        Raises:
            TypeError: ``data`` is not a mapping of names to values.
        """
        if not isinstance(data, Mapping):
            raise TypeError(
                f"log_data(state, log_level, data): data={data!r} must be a dict of names to "
                'values, e.g. {"loss": 0.5}'
            )
        timestamp = getattr(state, "timestamp", None)
        step = int(timestamp.batch) if timestamp is not None else 0
        record = LogRecord(
            dict(data), step, time.time(), _to_level(log_level), timestamp, _live=state
        )
        return self.log_record(record)


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


# Shown as ``trainbus.X`` in tracebacks and reprs (it is exported there; pickling works).
LoggerDestination.__module__ = "trainbus"
