"""``InMemoryLogger``: keeps every logged value in memory, as Composer's does."""

from __future__ import annotations

from typing import Any

from trainbus.core.destination import LoggerDestination
from trainbus.core.logger import LogLevel, LogRecord, _to_level
from trainbus.core.timer import Timestamp

__all__ = ["InMemoryLogger"]


class InMemoryLogger(LoggerDestination):
    """A destination that keeps everything logged, for tests and notebooks.

    Attributes:
        data: Per metric name, a list of ``(timestamp, level, value)`` in logged order.
        steps: Per metric name, the step of each value in ``data``.
        most_recent_values: The latest value of each metric.
        most_recent_timestamps: The timestamp of the latest value of each metric.
        hyperparameters: Everything logged with ``log_hyperparameters``.

    Example:
        >>> logger = InMemoryLogger()
        >>> trainer = Trainer(..., loggers=[logger])
        >>> trainer.fit_sync()
        >>> logger.get_timeseries("loss/train")["batch"][:3]
        [1, 2, 3]
    """

    def __init__(self, log_level: LogLevel | int | str = LogLevel.MICROBATCH) -> None:
        self.log_level = _to_level(log_level)
        self.data: dict[str, list[tuple[Timestamp, LogLevel, Any]]] = {}
        self.steps: dict[str, list[int]] = {}
        self.most_recent_values: dict[str, Any] = {}
        self.most_recent_timestamps: dict[str, Timestamp] = {}
        self.hyperparameters: dict[str, Any] = {}

    def log_record(self, record: LogRecord) -> None:
        """Store ``record`` (levels above ``log_level`` are dropped)."""
        if record.hyperparameters:
            self.hyperparameters.update(record.metrics)
            return
        if record.level > self.log_level:
            return
        ts = record.timestamp if record.timestamp is not None else Timestamp()
        for name, value in record.metrics.items():
            self.data.setdefault(name, []).append((ts, record.level, value))
            self.steps.setdefault(name, []).append(record.step)
            self.most_recent_values[name] = value
            self.most_recent_timestamps[name] = ts

    def get_timeseries(self, metric: str) -> dict[str, list[Any]]:
        """The values of ``metric`` with the counters and step of each.

        Returns:
            ``{metric: [...], "step": [...]}`` and one list per counter in
            ``Timestamp._fields`` (``"epoch"``, ``"batch"``, ``"batch_in_epoch"``,
            ``"sample"``, ``"sample_in_epoch"``, ``"token"``, ``"token_in_epoch"``, as
            Composer's), of ints, all of equal length.

        Raises:
            KeyError: Nothing was logged under ``metric``; the message lists what was.
        """
        if metric not in self.data:
            raise KeyError(f"no values logged for {metric!r}; logged: {sorted(self.data)}")
        rows = self.data[metric]
        series: dict[str, list[Any]] = {
            metric: [value for _, _, value in rows],
            "step": list(self.steps[metric]),
        }
        counters = [ts.state_dict() for ts, _, _ in rows]
        for name in Timestamp._fields:
            series[name] = [c[name] for c in counters]
        return series
