"""``JSONLinesLogger``: every logged point as one JSON object per line, in logged order.

Each line is ``{"name", "value", "step", "wall_time", "level", "kind"}``:

- ``value``: a number, a string, a list (multi-element tensors are written with
  ``.tolist()``) or another JSON value. Non-finite floats are written as the strings
  ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (the proto3 JSON convention): the file
  stays valid JSON, no value is lost, and ``float(value)`` reads them back.
- ``level``: ``"fit"``, ``"epoch"``, ``"batch"`` or ``"microbatch"``.
- ``kind``: ``"metric"``, or ``"hyperparameter"`` for ``log_hyperparameters`` values.

The file is opened (append mode, parent folders created) at ``fit_start``, written
through a buffer off the event loop, flushed when ``flush_seconds`` seconds
have passed since the last flush and a point is written, and flushed and ``fsync``-ed at
``close``, which runs also when training fails: a failure loses no logged point.

A torn last line (a write cut short by a full disk or a crash, so the file does not end
with a newline) is repaired when the file is opened: the fragment after the last newline
is appended, with a newline, to ``<file>.torn`` beside it, the file is cut back to its
last complete line, and a :class:`~trainbus.TrainbusWarning` names both files. The next
record therefore starts a line of its own, and every line of the file parses.

The logger writes only to files it opens as regular files: the file and ``<file>.torn`` are
opened with ``O_NOFOLLOW``, so a symbolic link planted under either name (by whoever can
write into the run's folder) is refused with an ``OSError`` naming it, and nothing is
written, cut or appended through it.

Crash consistency: ``state_dict`` (saved in every checkpoint) flushes and ``fsync``-s the
file and records its length. A run resumed from that checkpoint (``load_state_dict``) reads
the metric lines after that length, which the killed run wrote after the checkpoint, and
skips the records it logs again with the same ``(name, step)`` (once each): the file holds
each point once, and every line parses. See ``docs/crash-consistency.md``.
"""

from __future__ import annotations

import errno
import json
import math
import numbers
import os
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import torch

from trainbus.core.destination import LoggerDestination
from trainbus.core.exceptions import TrainbusWarning
from trainbus.core.logger import LogRecord
from trainbus.core.renamed import renamed_option

if TYPE_CHECKING:
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["JSONLinesLogger", "to_json_value"]

_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}
_CHUNK = 1 << 16
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _open_regular(path: Path, flags: int) -> int:
    """``os.open`` that refuses a symbolic link at ``path`` (with a message naming it)."""
    try:
        return os.open(path, flags | _NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise OSError(
            errno.ELOOP,
            f"JSONLinesLogger: {str(path)!r} is a symbolic link; the logger writes only to "
            "regular files and never through a link it did not create: remove the link, or "
            "pass the file it points to as path=...",
            str(path),
        ) from None


def _cut_torn_tail(path: Path) -> Path | None:
    """Move a last line without its newline to ``<path>.torn``; return that file, or None."""
    try:
        f = open(_open_regular(path, os.O_RDWR), "r+b")  # noqa: SIM115
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
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        with open(_open_regular(torn, flags), "ab") as aside:  # kept first, durably: then cut
            aside.write(fragment + b"\n")
            aside.flush()
            os.fsync(aside.fileno())
        f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())
    return torn


def _metric_keys(data: bytes) -> Counter[tuple[str, int]]:
    """``(name, step)`` of the metric lines in ``data`` (a torn last line is ignored)."""
    keys: Counter[tuple[str, int]] = Counter()
    for line in data.splitlines():
        try:
            record = json.loads(line)
            if record.get("kind") == "metric":
                keys[(str(record["name"]), int(record["step"]))] += 1
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return keys


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

    Its methods are plain functions, so writes happen on the destination's own thread (or,
    while they stay cheap, in bursts on the training thread), never on the event loop.
    Points are written in the order they were logged; every point logged before ``fit()``
    returns (or raises) is in the file, flushed and ``fsync``-ed, when it does.

    Args:
        path: The file; parent folders are created. Each ``fit()`` appends to it,
            after moving a torn last line (no newline) aside to ``<path>.torn``.
        flush_seconds: Seconds between flushes of the write buffer while training
            (checked whenever a point is written); ``0`` flushes after every record.
        flush_interval: Deprecated name of ``flush_seconds`` (warns once).

    Example:
        >>> trainer = Trainer(model, loader, "1ep", loggers=[JSONLinesLogger("runs/m.jsonl")])
        >>> trainer.fit_sync()
        >>> open("runs/m.jsonl").readline()
        '{"name":"loss/train","value":1.309,"step":1,"wall_time":1718000000.1,...}\\n'
    """

    rank_zero_only = True  # under torchrun: rank 0 only (docs/distributed.md)
    #: Its handlers read only their event's snapshot and the records it receives, never
    #: the live model: they may trail training by 2 batches (``docs/concurrency.md``,
    #: "Trailing handlers"). A subclass that reads live state sets ``trailing = None``.
    trailing = 2

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        flush_seconds: float = 1.0,
        flush_interval: float | None = None,
    ) -> None:
        flush_seconds = renamed_option(
            "JSONLinesLogger", "flush_interval", flush_interval, "flush_seconds", flush_seconds,
            default=1.0,
        )
        if not isinstance(path, str | os.PathLike):
            raise TypeError(
                f"path={path!r} must be a str or a path, e.g. JSONLinesLogger('runs/m.jsonl')"
            )
        if (
            isinstance(flush_seconds, bool)
            or not isinstance(flush_seconds, int | float)
            or not flush_seconds >= 0
        ):
            raise ValueError(
                f"flush_seconds={flush_seconds!r} must be a number of seconds >= 0, "
                "e.g. 1.0 (0 flushes after every record)"
            )
        self.path = Path(path)
        self.flush_seconds = float(flush_seconds)
        self._file: IO[str] | None = None
        self._last_flush = 0.0
        self._opened_size: int | None = None  # the file's length when this logger opened it
        self._replayed: Counter[tuple[str, int]] = Counter()  # skipped once each on resume
        self._replayed_until: int | None = None  # the killed run's last step after it

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
            fd = _open_regular(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            self._file = open(fd, "a", encoding="utf-8", newline="\n")  # noqa: SIM115
            if self._opened_size is None:
                self._opened_size = self._file.tell()
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
        replayed = self._replayed
        for name, value in record.metrics.items():
            if replayed and kind == "metric" and replayed[(name, record.step)] > 0:
                replayed[(name, record.step)] -= 1  # written by the run that was killed
                continue
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
        if now - self._last_flush >= self.flush_seconds:
            file.flush()
            self._last_flush = now

    def state_dict(self) -> dict[str, Any]:
        """Flush and ``fsync`` the file; its path and length, and the replays not yet seen.

        Called by :class:`~trainbus.callbacks.CheckpointSaver` on the training thread once
        every handler has run.
        """
        file = self._file
        if file is not None:
            file.flush()
            os.fsync(file.fileno())
            self._last_flush = time.monotonic()
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        pending = [[name, step] for (name, step), n in self._replayed.items() for _ in range(n)]
        return {"path": os.path.abspath(self.path), "position": size, "pending": pending}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: skip the points the killed run wrote after the checkpoint (once each).

        Applies only when ``state`` names this logger's file. The metric lines after the
        checkpoint's position (and those still pending at the checkpoint) are points the
        resumed run logs again; each is skipped once instead of written twice.
        """
        if state.get("path") != os.path.abspath(self.path):
            return
        replayed: Counter[tuple[str, int]] = Counter(
            (str(name), int(step)) for name, step in state.get("pending", [])
        )
        if self._file is not None:
            self._file.flush()
        try:
            with open(self.path, "rb") as f:
                f.seek(int(state.get("position", 0)))
                end = self._opened_size  # lines this logger wrote are not the killed run's
                data = f.read() if end is None else f.read(max(0, end - f.tell()))
        except FileNotFoundError:
            data = b""
        replayed.update(_metric_keys(data))
        self._replayed = replayed
        self._replayed_until = max((step for _, step in replayed), default=None)

    def replayed_until(self) -> int | None:
        """The last step the killed run wrote after the checkpoint this run resumed from
        (the batches up to it are trained again: the time account's ``replayed``), or
        ``None`` when it did not resume from a checkpoint with later points."""
        return self._replayed_until

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
