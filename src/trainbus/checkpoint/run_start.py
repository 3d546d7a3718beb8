"""The run's start in its saver's folder: what a restart before the first checkpoint resumes.

A run started with ``load_path`` naming the folder of one of its ``CheckpointSaver``s (one
command line that starts and resumes a job) resumes from the folder's newest checkpoint.
Before the first checkpoint there is none, yet a run killed then has logged points: its
destinations hold them (a JSON-lines file, TensorBoard's events, a W&B run, an uploader's
journal and its server, an MLflow run). So the folder holds the run's *start*:

- The first run in the folder (no checkpoint, no start file) writes ``.trainbus-start.json``
  in the Trainer's constructor, before ``INIT`` and before anything is logged: the
  ``state_dict()`` of each of its destinations (``LoggerDestination``), the same state a
  checkpoint holds for them (the W&B run id, the JSON-lines file's length, the TensorBoard
  folder's event files, the uploader's journal and its position), taken before the run
  logged anything. A run whose destinations have no state (the console, ``InMemoryLogger``,
  an uploader without a journal) writes none.
- A run started again in that folder before any checkpoint (the start file is there, no
  checkpoint) does not write it again: its destinations resume from it (``load_state_dict``,
  after ``INIT``, where a checkpoint's are restored) while the model trains from the start.
  Each destination then applies the replay rule of ``docs/crash-consistency.md`` to
  everything the earlier runs logged since the start: the same W&B and MLflow run, each
  ``(name, step)`` once, the first value kept.
- Once the folder holds a checkpoint, the checkpoint is what a run resumes from; the start
  file stays (it is the run's identity) and is read only while no checkpoint exists. A new
  run needs a new folder (or the old one deleted).

The file is JSON (only destinations whose state is JSON data take part; another is left
out with a :class:`~trainbus.CheckpointWarning`), written to a temporary name, ``fsync``-ed
and renamed; its name starts with a dot, so it is never taken for a checkpoint. Under
``torchrun`` only rank zero reads and writes it (destinations log on rank zero).
"""

from __future__ import annotations

import json
import os
import pathlib
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trainbus.checkpoint.format import callback_keys, temp_path_for
from trainbus.core.destination import LoggerDestination
from trainbus.core.exceptions import CheckpointWarning

if TYPE_CHECKING:
    from trainbus.core.callback import Callback

__all__ = ["START_NAME", "RunStart", "read_start", "start_folder", "write_start"]

#: The start file's name in the saver's folder.
START_NAME = ".trainbus-start.json"
_FORMAT = 1


class RunStart:
    """A run's start as read from its saver's folder: each destination's state by key.

    Attributes:
        path: The start file.
        destinations: ``{callback key: state_dict}`` (keys as in a checkpoint).
    """

    def __init__(self, path: pathlib.Path, destinations: dict[str, dict[str, Any]]) -> None:
        self.path = path
        self.destinations = destinations

    def restore(self, callbacks: Sequence[Callback]) -> list[str]:
        """``load_state_dict`` each destination with its state at the start; returns the
        keys of those restored."""
        restored = []
        for key, cb in callback_keys(list(callbacks)):
            state = self.destinations.get(key)
            if isinstance(cb, LoggerDestination) and isinstance(state, dict):
                cb.load_state_dict(state)
                restored.append(key)
        return restored


def start_folder(
    load_path: str | os.PathLike[str] | None, saver_folders: Sequence[pathlib.Path]
) -> pathlib.Path | None:
    """The saver folder ``load_path`` names (the folder the run's start goes in), or
    ``None``: no ``load_path``, an S3 URL, or a path that is no saver's folder."""
    if load_path is None or (isinstance(load_path, str) and load_path.startswith("s3://")):
        return None
    target = pathlib.Path(load_path).resolve()
    return next((f for f in saver_folders if pathlib.Path(f).resolve() == target), None)


def read_start(folder: pathlib.Path) -> RunStart | None:
    """The start file in ``folder``, or ``None`` (none, or unreadable: warned about)."""
    path = folder / START_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != _FORMAT or not isinstance(data.get("destinations"), dict):
            raise ValueError(f"not a trainbus start file of format {_FORMAT}")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError) as exc:
        warnings.warn(
            f"{str(path)!r} cannot be read ({exc}); this run starts its destinations afresh "
            "and writes it again",
            CheckpointWarning,
            stacklevel=3,
        )
        return None
    return RunStart(path, data["destinations"])


def write_start(folder: pathlib.Path, callbacks: Sequence[Callback]) -> pathlib.Path | None:
    """Write the destinations' state now as the run's start in ``folder`` (created if
    missing): to a temporary name, ``fsync``-ed, renamed, the folder ``fsync``-ed. A run
    whose destinations have no state (none, or none that resumes) writes nothing
    (returns ``None``)."""
    states: dict[str, Any] = {}
    for key, cb in callback_keys(list(callbacks)):
        if not isinstance(cb, LoggerDestination):
            continue
        state = cb.state_dict()
        if not state:
            continue
        try:
            json.dumps(state, allow_nan=True)
        except (TypeError, ValueError) as exc:
            warnings.warn(
                f"{key}: its state_dict() is not JSON data ({exc}), so a restart before the "
                "first checkpoint cannot resume it; it starts afresh then",
                CheckpointWarning,
                stacklevel=3,
            )
            continue
        states[key] = state
    if not states:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / START_NAME
    temp = temp_path_for(path)
    data = json.dumps({"format": _FORMAT, "destinations": states}, indent=1) + "\n"
    try:
        with open(temp, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    _fsync_folder(folder)
    return path


def _fsync_folder(folder: pathlib.Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some platforms cannot open a directory; the rename still happened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
