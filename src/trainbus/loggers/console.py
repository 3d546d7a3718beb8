"""``ConsoleLogger``: one compact line of the latest metrics per logging interval.

Points are collected as they arrive and printed at interval boundaries, one line per
step, labelled with the step the values were logged at (not the position of training
when the line is printed), so the console shows the same ``(name, step)`` points as the
file and TensorBoard destinations::

    [hparams] lr=0.1 batch_size=64
    [epoch 1 batch 20] loss/train=0.4123 lr=0.1000
    [epoch 1 batch 40] loss/train=0.3310 eval/loss=0.3560

Where the boundaries are: ``batch_checkpoint`` for batch intervals, ``epoch_checkpoint``
for epoch intervals, and always at ``eval_end``, ``fit_end`` and ``close``, so eval
results and whatever callbacks log while closing are printed too.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

import torch

from trainbus.core.destination import LoggerDestination
from trainbus.core.logger import LogRecord
from trainbus.core.time import Time, TimeUnit, ensure_time
from trainbus.core.timer import Timestamp

if TYPE_CHECKING:
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["ConsoleLogger"]

_STREAM_NAMES = ("stdout", "stderr")


@dataclass(slots=True)
class _Point:
    step: int
    label: str
    value: Any


def _parse_interval(log_interval: Time[Any] | str | int) -> Time[int]:
    interval = ensure_time(log_interval, name="log_interval")
    if (
        interval.unit not in (TimeUnit.EPOCH, TimeUnit.BATCH)
        or not isinstance(interval.value, int)
        or interval.value <= 0
    ):
        raise ValueError(
            f"log_interval={log_interval!r} must be a positive number of epochs or batches, "
            "e.g. '1ep', '50ba' or 2 (epochs)"
        )
    return interval


def format_value(value: Any) -> str:
    """A short rendering of one logged value for a console line.

    Example:
        >>> format_value(0.41234), format_value(3), format_value(float("nan"))
        ('0.4123', '3', 'nan')
    """
    if isinstance(value, int):  # bools too
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value == 0 or 1e-3 <= abs(value) < 1e5:
            return f"{value:.4f}"
        return f"{value:.4e}"
    if isinstance(value, torch.Tensor):
        if value.numel() <= 4:
            return "[" + ",".join(format_value(v) for v in value.flatten().tolist()) + "]"
        return f"tensor(shape={tuple(value.shape)})"
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _position(step: int, ts: Timestamp | None) -> str:
    """``epoch E batch S`` (``E`` is 1-based: the epoch the step belongs to)."""
    if ts is None:
        return f"step {step}"
    # Inside an epoch that has not finished yet; else at an epoch's end (or before the first).
    epoch = int(ts.epoch) + 1 if int(ts.batch_in_epoch) > 0 else max(int(ts.epoch), 1)
    kind = "batch" if step == int(ts.batch) else "step"
    return f"epoch {epoch} {kind} {step}"


class ConsoleLogger(LoggerDestination):
    """Prints the latest metrics at an interval, in one compact line per step.

    Its methods are plain functions: they run on the destination's own thread (or, while
    they stay cheap, in bursts on the training thread), never on the event loop.
    Hyperparameters are printed once (again only if one changes).

    Args:
        log_interval: How often to print: ``"1ep"`` (default), ``"50ba"``, a
            :class:`~trainbus.Time` in epochs or batches, or an int number of epochs.
            Evaluation results are also printed when an evaluation ends.
        stream: Where to write: a text stream, ``"stdout"`` or ``"stderr"``. The default,
            ``None``, is whatever ``sys.stdout`` is at the moment a line is printed.

    Example:
        >>> trainer = Trainer(model, loader, "2ep", loggers=[ConsoleLogger("10ba")])
        >>> trainer.fit_sync()
        [epoch 1 batch 10] loss/train=0.4123
    """

    rank_zero_only = True  # under torchrun: rank 0 only (docs/distributed.md)
    #: Its handlers read only their event's snapshot and the records it receives, never
    #: the live model: they may trail training by 2 batches (``docs/concurrency.md``,
    #: "Trailing handlers"). A subclass that reads live state sets ``trailing = None``.
    trailing = 2

    def __init__(
        self,
        log_interval: Time[Any] | str | int = "1ep",
        stream: TextIO | str | None = None,
    ) -> None:
        self.log_interval = _parse_interval(log_interval)
        if isinstance(stream, str) and stream not in _STREAM_NAMES:
            raise ValueError(
                f"stream={stream!r} is not a stream name; use 'stdout', 'stderr', a text "
                "stream (e.g. open('log.txt', 'w')) or None for sys.stdout"
            )
        if (
            stream is not None
            and not isinstance(stream, str)
            and not callable(getattr(stream, "write", None))
        ):
            raise TypeError(
                f"stream={stream!r} has no write() method; pass a text stream, 'stdout', "
                "'stderr' or None"
            )
        self.stream = stream
        self._pending: dict[str, _Point] = {}
        self._hparams: dict[str, str] = {}

    # -- output -------------------------------------------------------------------------------

    def _out(self) -> TextIO:
        stream = self.stream
        if stream is None or stream == "stdout":
            return sys.stdout
        if stream == "stderr":
            return sys.stderr
        assert not isinstance(stream, str)
        return stream

    def _write(self, line: str) -> None:
        out = self._out()
        out.write(line + "\n")
        out.flush()

    def _print_pending(self) -> None:
        if not self._pending:
            return
        lines: dict[tuple[int, str], list[str]] = {}
        for name, point in self._pending.items():
            lines.setdefault((point.step, point.label), []).append(
                f"{name}={format_value(point.value)}"
            )
        self._pending = {}
        for (_, label), parts in sorted(lines.items(), key=lambda kv: kv[0][0]):
            self._write(f"[{label}] " + " ".join(parts))

    # -- destination ---------------------------------------------------------------------------

    def log_record(self, record: LogRecord) -> None:
        """Print new hyperparameters now; keep metrics for the next boundary."""
        if record.hyperparameters:
            fresh = {}
            for name, value in record.metrics.items():
                plain = isinstance(value, bool | int | float | str) and len(str(value)) <= 40
                text = str(value) if plain else format_value(value)
                if self._hparams.get(name) != text:
                    fresh[name] = self._hparams[name] = text
            if fresh:
                self._write("[hparams] " + " ".join(f"{k}={v}" for k, v in fresh.items()))
            return
        label = _position(record.step, record.timestamp)
        for name, value in record.metrics.items():
            self._pending.pop(name, None)  # keep the latest value, in arrival order
            self._pending[name] = _Point(record.step, label, value)

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        """Print at batch intervals."""
        interval = self.log_interval
        if interval.unit is TimeUnit.BATCH and int(state.timer.batch) % interval.value == 0:
            self._print_pending()

    def epoch_checkpoint(self, state: State, logger: Logger) -> None:
        """Print at epoch intervals (after the epoch's evaluation)."""
        interval = self.log_interval
        if interval.unit is TimeUnit.EPOCH and int(state.timer.epoch) % interval.value == 0:
            self._print_pending()

    def eval_end(self, state: State, logger: Logger) -> None:
        """Print evaluation results (and the latest training values) when evaluation ends."""
        self._print_pending()

    def fit_end(self, state: State, logger: Logger) -> None:
        """Print what was logged since the last line."""
        self._print_pending()

    def close(self, state: State, logger: Logger) -> None:
        """Print what was logged since the last line (also after a failure)."""
        self._print_pending()
