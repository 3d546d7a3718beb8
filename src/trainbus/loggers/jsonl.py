"""``JSONLinesLogger``: every logged point as one JSON object per line, in logged order.

Each line is ``{"name", "value", "step", "wall_time", "level", "kind"}``:

- ``value``: a number, a string, a list (multi-element tensors are written with
  ``.tolist()``) or another JSON value. Non-finite floats are written as the strings
  ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (the proto3 JSON convention): the file
  stays valid JSON, no value is lost, and ``float(value)`` reads them back.
- ``level``: ``"fit"``, ``"epoch"``, ``"batch"`` or ``"microbatch"``.
- ``kind``: ``"metric"``, or ``"hyperparameter"`` for ``log_hyperparameters`` values.

The file is opened (append mode, parent folders created) at ``fit_start``, written
through a buffer on the destination's own thread, flushed when ``flush_interval`` seconds
have passed since the last flush and a point is written, and flushed and ``fsync``-ed at
``close``, which runs also when training fails: a failure loses no logged point.

A torn last line (a write cut short by a full disk or a crash, so the file does not end
with a newline) is repaired when the file is opened: the fragment after the last newline
is appended, with a newline, to ``<file>.torn`` beside it, the file is cut back to its
last complete line, and a :class:`~trainbus.TrainbusWarning` names both files. The next
record therefore starts a line of its own, and every line of the file parses.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import time
import warnings
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import torch

from trainbus._exceptions import TrainbusWarning
from trainbus._logger import LoggerDestination, LogRecord

if TYPE_CHECKING:
    from trainbus._logger import Logger
    from trainbus._state import State

__all__ = ["JSONLinesLogger", "to_json_value"]

_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}
_CHUNK = 1 << 16


def _cut_torn_tail(path: Path) -> Path | None:
    """Move a last line without its newline to ``<path>.torn``; return that file, or None."""
    try:
        f = open(path, "r+b")  # noqa: SIM115
    except FileNotFoundError:
        return None
    with f:
        end = f.seek(0, os.SEEK_END)
        if end == 0:
            return None
        f.seek(end - 1)
        if f.read(1) == b"\n":
            return None
        cut, pos = 0, end
        while pos > 0:  # the last newline, searched backwards a chunk at a time
            start = max(0, pos - _CHUNK)
            f.seek(start)
            found = f.read(pos - start).rfind(b"\n")
            if found >= 0:
                cut = start + found + 1
                break
            pos = start
        f.seek(cut)
        fragment = f.read()
        torn = path.with_name(path.name + ".torn")
        with open(torn, "ab") as aside:  # kept first, durably: only then is it cut
            aside.write(fragment + b"\n")
            aside.flush()
            os.fsync(aside.fileno())
        f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())
    return torn


def to_json_value(value: Any) -> Any:
    """``value`` as something ``json.dumps(..., allow_nan=False)`` accepts.

    Example:
        >>> to_json_value(torch.tensor([1.0, float("inf")]))
        [1.0, 'Infinity']
        >>> to_json_value(float("nan"))
        'NaN'
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else _NON_FINITE[value]
    if isinstance(value, torch.Tensor):
        return to_json_value(value.detach().cpu().tolist())
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return to_json_value(float(value))
    if isinstance(value, dict):
        return {str(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_json_value(v) for v in value]
    tolist = getattr(value, "tolist", None)  # numpy arrays
    if callable(tolist):
        return to_json_value(tolist())
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


class JSONLinesLogger(LoggerDestination):
    """Appends every logged point to a JSON-lines file.

    Its methods are plain functions, so writes happen on the destination's own thread,
    never on the event loop. Points are written in the order they were logged; every
    point logged before ``fit()`` returns (or raises) is in the file, flushed and
    ``fsync``-ed, when it does.

    Args:
        path: The file; parent folders are created. Each ``fit()`` appends to it,
            after moving a torn last line (no newline) aside to ``<path>.torn``.
        flush_interval: Seconds between flushes of the write buffer while training
            (checked whenever a point is written); ``0`` flushes after every record.

    Example:
        >>> trainer = Trainer(model, loader, "1ep", loggers=[JSONLinesLogger("runs/m.jsonl")])
        >>> trainer.fit_sync()
        >>> open("runs/m.jsonl").readline()
        '{"name":"loss/train","value":1.309,"step":1,"wall_time":1718000000.1,...}\\n'
    """

    #: Its handlers read only their event's snapshot and the records it receives, never
    #: the live model: they may trail training by 2 batches (``docs/concurrency.md``,
    #: "Trailing handlers"). A subclass that reads live state sets ``trailing = None``.
    trailing = 2


    def __init__(self, path: str | os.PathLike[str], *, flush_interval: float = 1.0) -> None:
        if not isinstance(path, str | os.PathLike):
            raise TypeError(
                f"path={path!r} must be a str or a path, e.g. JSONLinesLogger('runs/m.jsonl')"
            )
        if (
            isinstance(flush_interval, bool)
            or not isinstance(flush_interval, int | float)
            or not flush_interval >= 0
        ):
            raise ValueError(
                f"flush_interval={flush_interval!r} must be a number of seconds >= 0, "
                "e.g. 1.0 (0 flushes after every record)"
            )
        self.path = Path(path)
        self.flush_interval = float(flush_interval)
        self._file: IO[str] | None = None
        self._last_flush = 0.0

    def _open(self) -> IO[str]:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            torn = _cut_torn_tail(self.path)
            if torn is not None:
                warnings.warn(
                    f"JSONLinesLogger: {str(self.path)!r} ended with a torn line (no "
                    f"newline; a full disk or a crash cut a write short); it was moved to "
                    f"{str(torn)!r} and the file now ends at its last complete line",
                    TrainbusWarning,
                    stacklevel=2,
                )
            self._file = open(self.path, "a", encoding="utf-8", newline="\n")  # noqa: SIM115
            self._last_flush = time.monotonic()
        return self._file

    def fit_start(self, state: State, logger: Logger) -> None:
        """Open the file for appending."""
        self._open()

    def log_record(self, record: LogRecord) -> None:
        """Write one line per point of ``record``."""
        file = self._open()  # also for records logged before fit_start (at INIT)
        kind = "hyperparameter" if record.hyperparameters else "metric"
        level = record.level.name.lower()
        for name, value in record.metrics.items():
            line = {
                "name": name,
                "value": to_json_value(value),
                "step": record.step,
                "wall_time": record.wall_time,
                "level": level,
                "kind": kind,
            }
            file.write(json.dumps(line, allow_nan=False, separators=(",", ":")) + "\n")
        now = time.monotonic()
        if now - self._last_flush >= self.flush_interval:
            file.flush()
            self._last_flush = now

    def close(self, state: State, logger: Logger) -> None:
        """Flush, ``fsync`` and close the file (runs also when training failed)."""
        file, self._file = self._file, None
        if file is None:
            return
        try:
            file.flush()
            os.fsync(file.fileno())
        finally:
            file.close()
