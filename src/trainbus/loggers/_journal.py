"""The write-ahead journal of an uploader's spool: a point is on disk before it is logged.

:class:`Journal` replaces :class:`~trainbus.loggers._spool.Spool` when
``HTTPMetricsUploader(journal=True)``. It is one append-only file, ``journal.jsonl`` in
the spool directory, one JSON object per line::

    {"journal": "<id>", "format": 1}                       the first line
    {"i": 7, "name": ..., "value": ..., "step": ..., "wall_time": ...}   point number 7
    {"seal": "<key>", "from": 0, "to": 100, "run": "..."}   points [0, 100) are one batch
    {"ack": "<key>"}                                        the server stored that batch
    {"rejected": "<key>"}                                   the server refused it (4xx)

- **Points** are appended by :meth:`Journal.admit`, called from ``log_record`` (one
  ``os.write`` per record, before the record is buffered), so a point is in the file
  (in the operating system's cache: a killed process loses nothing) before it counts
  as logged, and before any checkpoint taken after it.
- **Seals** are appended (and the file ``fsync``-ed) by :meth:`Journal.write`, which the
  stager calls before a batch's first attempt: the ``Idempotency-Key`` is on disk before
  the server can see it, and a resend after a crash uses the same key. The ``fsync`` per
  seal is the journal's fsync cadence: points reach the platter at most one seal (one
  ``flush_interval``, or ``batch_size`` points) after they were logged, and at every
  checkpoint (:meth:`Journal.state_dict`).
- **Acks** are appended after a 2xx, without ``fsync`` (a lost ack means one resend
  under the same key, which the server ignores).

A restarted uploader reads the file once (:meth:`Journal.open`): sealed batches without
an ack are resent with their keys; points never sealed are sealed now, with new keys
recorded first. :meth:`Journal.state_dict` (saved in each checkpoint) records how many
points the journal held at the checkpoint; :meth:`Journal.load_state_dict` turns the
points after that position into the *replayed* set, and :meth:`Journal.admit` drops a
logged point whose ``(name, step)`` is in it (once per occurrence): the resumed run
replays the batches after the checkpoint, whose points the killed run already journaled.
``docs/crash-consistency.md`` states the guarantees and their limits.

All methods are thread-safe (a lock); file reads and ``fsync`` happen off the event loop
except :meth:`admit`'s single ``os.write``.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from trainbus.loggers._spool import Batch, Spool

__all__ = ["JOURNAL_NAME", "Journal"]

JOURNAL_NAME = "journal.jsonl"
_FORMAT = 1
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


class Journal(Spool):
    """An append-only journal of points, seals and acks (see the module docstring).

    Args:
        directory: The spool directory (created if missing); may also hold batch files
            of an uploader that ran without a journal: they are resent too.
        batch_size: Points per batch when sealing points a killed run never sealed.
    """

    #: Its points are on disk before they are batched: a batch whose seal could not be
    #: written is sealed again by the next run (the uploader's close warning says so).
    journaled = True

    def __init__(self, directory: str | os.PathLike[str], *, batch_size: int) -> None:
        super().__init__(directory)
        self.path = self.directory / JOURNAL_NAME
        self.batch_size = batch_size
        self._lock = threading.RLock()
        self._fd: int | None = None
        self._id = ""
        self._count = 0  # points in the journal (the next point's number)
        self._sealed = 0  # points [0, _sealed) belong to sealed batches
        self._earlier: list[tuple[str, int]] = []  # (name, step) of points found at open
        self._leftover: dict[str, Batch] = {}  # unacknowledged batches found at open
        self._replayed: Counter[tuple[str, int]] = Counter()
        self._names: dict[str, str] = {}  # metric names, JSON-quoted
        self.fsyncs = 0
        self.corrupt: tuple[Path, str] | None = None  # a journal that could not be read

    # -- opening and recovery ------------------------------------------------------------------

    def open(self) -> None:
        """Read the journal left by earlier runs (once) and open it for appending."""
        with self._lock:
            if self._fd is not None:
                return
            # O_NOFOLLOW: a symbolic link planted as the journal is refused (ELOOP), never
            # appended through.
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW
            if self._id and self.path.exists():  # reopened by this process: nothing to read
                self._fd = os.open(self.path, flags, 0o644)
                return
            points: list[dict[str, Any]] = []
            seals: list[tuple[str, int, int, str | None]] = []
            done: set[str] = set()
            if self.path.exists():
                try:
                    self._read_file(points, seals, done)
                except (ValueError, KeyError, TypeError, IndexError) as exc:
                    aside = self.path.with_name(f"{JOURNAL_NAME}.corrupt-{uuid.uuid4().hex[:8]}")
                    os.replace(self.path, aside)
                    self.corrupt = (aside, str(exc))
                    points, seals, done = [], [], set()
            self._count = self._sealed = 0
            self._earlier, self._leftover = [], {}
            fresh = not self.path.exists() or self.path.stat().st_size == 0
            self._fd = os.open(self.path, flags, 0o644)
            if fresh:
                self._id = uuid.uuid4().hex
                self._write([{"journal": self._id, "format": _FORMAT}])
                self._sync()
                self._sync_directory()
            self._count = len(points)
            self._earlier = [(str(p["name"]), int(p["step"])) for p in points]
            for key, start, end, run in seals:
                self._sealed = max(self._sealed, end)
                if key not in done:
                    self._leftover[key] = self._batch(key, points[start:end], run)
            records = []
            for start in range(self._sealed, self._count, self.batch_size):
                end = min(self._count, start + self.batch_size)
                key = str(uuid.uuid4())
                records.append({"seal": key, "from": start, "to": end, "run": None})
                self._leftover[key] = self._batch(key, points[start:end], None)
            self._sealed = self._count
            if records:
                self._write(records)
                self._sync()

    def _batch(self, key: str, points: list[dict[str, Any]], run: str | None) -> Batch:
        return Batch(key=key, points=points, run=run, created_ns=0, path=self.path)

    def _read_file(
        self,
        points: list[dict[str, Any]],
        seals: list[tuple[str, int, int, str | None]],
        done: set[str],
    ) -> None:
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end < len(data):  # a torn last line (power loss): cut it, it was never acted on
            with open(os.open(self.path, os.O_RDWR | _NOFOLLOW), "r+b") as f:
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())
            data = data[:end]
        lines = data.splitlines()
        header = json.loads(lines[0]) if lines else {}
        if header.get("format") != _FORMAT or not isinstance(header.get("journal"), str):
            raise ValueError(f"{self.path} is not a trainbus journal of format {_FORMAT}")
        self._id = header["journal"]
        for line in lines[1:]:
            record = json.loads(line)
            if "i" in record:
                if record.pop("i") != len(points):
                    raise ValueError(f"{self.path}: point {len(points)} is missing")
                points.append(record)
            elif "seal" in record:
                seals.append((record["seal"], record["from"], record["to"], record["run"]))
            elif "ack" in record:
                done.add(record["ack"])
            elif "rejected" in record:
                done.add(record["rejected"])

    # -- points ----------------------------------------------------------------------------------

    def admit(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Drop replayed points, append the others (one write); return those appended."""
        with self._lock:
            if self._fd is None:
                self.open()
            replayed = self._replayed
            if replayed:
                kept = []
                for item in items:
                    key = (item["name"], item["step"])
                    if replayed[key] > 0:
                        replayed[key] -= 1
                        if not replayed[key]:
                            del replayed[key]
                    else:
                        kept.append(item)
                items = kept
            if items:
                first = self._count
                lines = [self._point_line(first + n, item) for n, item in enumerate(items)]
                self._write_bytes("".join(lines).encode())
                self._count = first + len(items)
            return items

    def _point_line(self, index: int, item: dict[str, Any]) -> str:
        """One point's line; formatted by hand (9x faster than ``json.dumps``) when its
        fields are the uploader's (a str name, an int step, finite floats)."""
        name, value, step, wall = item["name"], item["value"], item["step"], item["wall_time"]
        if type(value) is float and type(step) is int and type(wall) is float:
            quoted = self._names.get(name)
            if quoted is None:
                quoted = self._names[name] = json.dumps(name)
            return (
                f'{{"i":{index},"name":{quoted},"value":{value!r},"step":{step},'
                f'"wall_time":{wall!r}}}\n'
            )
        return _dumps({"i": index, **item}) + "\n"

    # -- the Spool interface (the stager and the sender call these in worker threads) ----------

    def write(self, batch: Batch) -> None:
        """Record ``batch``'s key and points (the next ones not sealed), then ``fsync``."""
        with self._lock:
            if self._fd is None:
                self.open()
            if batch.path is None:
                start = self._sealed
                self._sealed = start + len(batch.points)
                record = {"seal": batch.key, "from": start, "to": self._sealed, "run": batch.run}
                self._write([record])
            self._sync()
        batch.path = self.path

    @property
    def ident(self) -> str:
        """The journal's id (its first line's), ``""`` before it is opened."""
        return self._id

    def remove(self, batch: Batch) -> None:
        """Record the server's acknowledgement of ``batch``."""
        if batch.path is not None and batch.path != self.path:
            super().remove(batch)  # a batch file of a run without a journal
            return
        with self._lock:
            self._leftover.pop(batch.key, None)
            if self._fd is not None:
                self._write([{"ack": batch.key}])
        batch.path = None

    def set_aside(self, batch: Batch) -> Path | None:
        """Record that the server refused ``batch``; it stays in the journal, never resent."""
        if batch.path is not None and batch.path != self.path:
            return super().set_aside(batch)
        with self._lock:
            self._leftover.pop(batch.key, None)
            if self._fd is not None:
                self._write([{"rejected": batch.key}])
        batch.path = None
        return self.path

    def load(self) -> tuple[list[Batch], list[Path]]:
        """Unacknowledged batches of earlier runs, oldest first (batch files included)."""
        files, corrupt = super().load()
        self.open()
        with self._lock:
            return [*files, *self._leftover.values()], corrupt

    # -- checkpoints -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The journal's id and length, and the replayed points not yet seen; ``fsync`` first."""
        self.open()
        self._sync()
        with self._lock:
            pending = [[name, step] for (name, step), n in self._replayed.items() for _ in range(n)]
            return {"journal": self._id, "position": self._count, "pending": pending}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a checkpoint: the points journaled after it will be replayed."""
        self.open()
        with self._lock:
            replayed: Counter[tuple[str, int]] = Counter(
                (str(name), int(step)) for name, step in state.get("pending", [])
            )
            if state.get("journal") == self._id:
                replayed.update(self._earlier[int(state.get("position", 0)) :])
            self._replayed = replayed

    def retire(self) -> None:
        """Delete the journal (everything delivered, the run complete); the next use starts anew."""
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is not None:
                os.close(fd)
            self.path.unlink(missing_ok=True)
            self._id = ""
            self._count = self._sealed = 0
            self._earlier, self._leftover, self._replayed = [], {}, Counter()

    def close(self) -> None:
        """``fsync`` and close the file (it stays; the next run reads it)."""
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is not None:
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

    # -- file ------------------------------------------------------------------------------------

    def _write(self, records: list[dict[str, Any]]) -> None:
        self._write_bytes("".join(_dumps(r) + "\n" for r in records).encode())

    def _write_bytes(self, data: bytes) -> None:
        assert self._fd is not None
        while data:
            written = os.write(self._fd, data)
            data = data[written:]

    def _sync(self) -> None:
        fd = self._fd
        if fd is not None:
            os.fsync(fd)
            self.fsyncs += 1
