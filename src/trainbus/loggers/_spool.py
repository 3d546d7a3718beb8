"""Sealed batches of metric points and the on-disk spool that keeps them until delivered.

A :class:`Batch` is what :class:`~trainbus.loggers.HTTPMetricsUploader` sends in one
request: a list of points, the run name and an ``Idempotency-Key`` drawn when the batch
was sealed. Its body is serialised once and reused for every attempt, so a retry never
differs from the first try.

A :class:`Spool` is a directory with one JSON file per undelivered batch::

    batch-<unix time ns>-<seq>-<key>.json   {"idempotency_key": ..., "body": {"run", "points"}}

A file is written atomically (a temporary file, ``fsync``, ``os.replace``, then an
``fsync`` of the directory), so after a crash a spool file is either complete or absent.
Names sort by creation time, so :meth:`Spool.load` returns batches oldest first. Batches
the server refused (a 4xx) are renamed ``*.rejected.json``: kept for inspection, never
resent. Everything here is blocking file I/O; the uploader calls it from worker threads.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Batch", "Spool"]

_FORMAT = 1
_SUFFIX = ".json"
_REJECTED = ".rejected.json"
_CORRUPT = ".corrupt"
_TMP_PREFIX = ".tmp-"


@dataclass(slots=True, eq=False)
class Batch:
    """One request's worth of points.

    Attributes:
        key: The ``Idempotency-Key``, the same on every attempt and after a restart.
        points: ``{"name", "value", "step", "wall_time"}`` dicts, in logged order.
        run: The run name sent with the points; set once, before the first attempt.
        created_ns: ``time.time_ns()`` when the batch was sealed (orders the spool).
        seq: The seal order within the process (breaks ties in the spool's order).
        path: The spool file, once written.
        unspoolable: Writing the spool file failed; the batch is sent from memory.
    """

    key: str
    points: list[dict[str, Any]]
    run: str | None = None
    created_ns: int = field(default_factory=time.time_ns)
    seq: int = 0
    path: Path | None = None
    unspoolable: bool = False
    _body: bytes | None = field(default=None, repr=False)

    @property
    def spooled(self) -> bool:
        """Whether the batch is on disk."""
        return self.path is not None

    def body(self) -> bytes:
        """The JSON request body; computed once, so every attempt sends the same bytes."""
        if self._body is None:
            if self.run is None:
                raise RuntimeError("a batch's run name must be set before it is serialised")
            payload = {"run": self.run, "points": self.points}
            self._body = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
        return self._body


class Spool:
    """A directory of undelivered batches (see the module docstring for the layout).

    Args:
        directory: Created (with parents) if missing.

    Raises:
        ValueError: ``directory`` exists and is not a directory, or cannot be created.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(
                f"spool_dir={str(directory)!r} cannot be used as a spool directory ({exc}); "
                "pass a writable directory path, or spool_dir=None to keep batches in memory"
            ) from None

    def _name(self, batch: Batch) -> str:
        return f"batch-{batch.created_ns:020d}-{batch.seq:08d}-{batch.key}{_SUFFIX}"

    def write(self, batch: Batch) -> None:
        """Write ``batch`` durably and set ``batch.path``; writing it again is harmless."""
        final = self.directory / self._name(batch)
        tmp = self.directory / f"{_TMP_PREFIX}{uuid.uuid4().hex}-{final.name}"  # ".tmp-<hex>-"
        record = {
            "format": _FORMAT,
            "idempotency_key": batch.key,
            "body": json.loads(batch.body()),
        }
        data = json.dumps(record, separators=(",", ":")).encode()
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:  # a full disk, say: leave no empty temporary file behind
            tmp.unlink(missing_ok=True)
            raise
        self._sync_directory()
        batch.path = final

    def remove(self, batch: Batch) -> None:
        """Delete ``batch``'s file after delivery (missing files are fine)."""
        if batch.path is not None:
            batch.path.unlink(missing_ok=True)
            batch.path = None

    def set_aside(self, batch: Batch) -> Path | None:
        """Rename a refused batch's file to ``*.rejected.json``; return its new path."""
        if batch.path is None:
            return None
        target = batch.path.with_name(batch.path.name[: -len(_SUFFIX)] + _REJECTED)
        try:
            os.replace(batch.path, target)
        except FileNotFoundError:
            return None
        batch.path = None
        return target

    def load(self) -> tuple[list[Batch], list[Path]]:
        """The spooled batches, oldest first, and the unreadable files (renamed ``.corrupt``).

        A temporary file left by a process killed between writing and renaming it is
        renamed and loaded if it is complete (its batch was never sent), else deleted.
        """
        for path in list(self.directory.iterdir()):
            if path.name.startswith(_TMP_PREFIX):
                final = path.with_name(path.name.split("-", 2)[2])
                try:
                    self._read(path, final.name)
                    os.replace(path, final)
                except (OSError, ValueError, KeyError, TypeError):
                    path.unlink(missing_ok=True)
        batches: list[Batch] = []
        corrupt: list[Path] = []
        for path in sorted(self.directory.iterdir()):
            name = path.name
            if not name.startswith("batch-") or not name.endswith(_SUFFIX):
                continue
            if name.endswith(_REJECTED):
                continue
            try:
                batches.append(self._read(path))
            except (OSError, ValueError, KeyError, TypeError):
                target = path.with_name(name + _CORRUPT)
                os.replace(path, target)
                corrupt.append(target)
        return batches, corrupt

    def _read(self, path: Path, name: str | None = None) -> Batch:
        record = json.loads(path.read_bytes())
        body = record["body"]
        if record.get("format") != _FORMAT or not isinstance(body["points"], list):
            raise ValueError(f"{path} is not a spool file of format {_FORMAT}")
        _, created, seq, _ = (name or path.name).split("-", 3)
        return Batch(
            key=str(record["idempotency_key"]),
            points=body["points"],
            run=str(body["run"]),
            created_ns=int(created),
            seq=int(seq),
            path=path,
        )

    def _sync_directory(self) -> None:
        """Make the rename durable (POSIX); a no-op where directories cannot be opened."""
        try:
            fd = os.open(self.directory, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)
