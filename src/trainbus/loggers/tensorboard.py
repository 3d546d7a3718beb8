"""``TensorBoardLogger``: scalars and hyperparameters as TensorBoard event files.

TensorBoard is an optional dependency (``pip install 'trainbus[tensorboard]'``); it is
imported when a ``TensorBoardLogger`` is created, never when ``trainbus.loggers`` is
imported.

What goes where:

- numbers (ints, floats, bools, 0-d tensors) -> ``add_scalar(name, value, step, wall_time)``;
- multi-element tensors -> ``add_histogram`` (as text when they hold non-finite values);
- strings and other values -> ``add_text``;
- hyperparameters -> one markdown table under the text tag ``hyperparameters``.

Crash consistency (``docs/crash-consistency.md``, "The replay rule"): ``state_dict`` (saved
in every checkpoint) flushes the event file and records the folder and the length of each
event file in it. A run resumed from that checkpoint writes into the same folder and drops
each value whose ``(name, step)`` the killed run already wrote after the checkpoint (once
each), so TensorBoard's reader sees every step once, with the killed run's value.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainbus.core.destination import LoggerDestination
from trainbus.core.exceptions import TrainbusWarning
from trainbus.core.logger import LogRecord
from trainbus.core.renamed import renamed_option
from trainbus.loggers._tfevents import event_files, events_after

if TYPE_CHECKING:
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["TensorBoardLogger"]

_MISSING = (
    "TensorBoardLogger needs the tensorboard package, which is not installed; "
    "install it with: pip install 'trainbus[tensorboard]'"
)


def _summary_writer_class() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ImportError(_MISSING) from exc
    return SummaryWriter


def _markdown_table(params: dict[str, Any]) -> str:
    rows = "\n".join(f"| {name} | {value!s} |" for name, value in params.items())
    return "| name | value |\n|---|---|\n" + rows


class TensorBoardLogger(LoggerDestination):
    """Writes logged scalars to TensorBoard event files in ``log_dir``.

    Its methods are plain functions: they run on the destination's own thread (or, while
    they stay cheap, in bursts on the training thread), never on the event loop. Each
    ``fit()`` writes a new event file in ``log_dir`` (TensorBoard reads them as one run);
    ``close`` flushes and closes it, also after a failure.

    A run resumed from a checkpoint (``Trainer(load_path=...)``) writes into the folder the
    checkpoint names (the run's identity: a requeued job that builds a new ``log_dir``
    still continues the killed run's folder, with a warning) and drops the values the
    killed run wrote after the checkpoint: each ``(name, step)`` appears once.

    Args:
        log_dir: The run's folder (created if missing); point ``tensorboard --logdir``
            at it or at its parent.
        flush_seconds: Seconds between flushes of pending events to disk while training
            (``SummaryWriter``'s ``flush_secs``).
        flush_secs: Deprecated name of ``flush_seconds`` (warns once).

    Raises:
        ImportError: The ``tensorboard`` package is not installed (the message says how
            to install it).

    Example:
        >>> trainer = Trainer(model, loader, "2ep", loggers=[TensorBoardLogger("runs/a")])
        >>> trainer.fit_sync()          # then: tensorboard --logdir runs
    """

    rank_zero_only = True  # under torchrun: rank 0 only (docs/distributed.md)
    #: Its handlers read only their event's snapshot and the records it receives, never
    #: the live model: they may trail training by 2 batches (``docs/concurrency.md``,
    #: "Trailing handlers"). A subclass that reads live state sets ``trailing = None``.
    trailing = 2

    def __init__(
        self,
        log_dir: str | os.PathLike[str],
        *,
        flush_seconds: float = 30.0,
        flush_secs: float | None = None,
    ) -> None:
        flush_seconds = renamed_option(
            "TensorBoardLogger", "flush_secs", flush_secs, "flush_seconds", flush_seconds,
            default=30.0,
        )
        if not isinstance(log_dir, str | os.PathLike):
            raise TypeError(
                f"log_dir={log_dir!r} must be a str or a path, e.g. TensorBoardLogger('runs/a')"
            )
        if (
            isinstance(flush_seconds, bool)
            or not isinstance(flush_seconds, int | float)
            or not (flush_seconds > 0)
        ):
            raise ValueError(
                f"flush_seconds={flush_seconds!r} must be a number of seconds > 0, e.g. 30"
            )
        if importlib.util.find_spec("tensorboard") is None:
            raise ImportError(_MISSING)
        # Imported here, on the caller's thread before any fit (an ImportError naming the
        # extra, not a failed fit_start; and a fit's first batches do not wait for the import).
        self._writer_class = _summary_writer_class()
        self.log_dir = Path(log_dir)
        self.flush_seconds = float(flush_seconds)
        self._writer: Any = None
        self._replayed: Counter[tuple[str, int]] = Counter()  # dropped once each on resume

    def _open(self) -> Any:
        if self._writer is None:
            self._writer = self._writer_class(
                log_dir=str(self.log_dir), flush_secs=self.flush_seconds
            )
        return self._writer

    def fit_start(self, state: State, logger: Logger) -> None:
        """Create the event file."""
        self._open()

    def log_record(self, record: LogRecord) -> None:
        """Write each value of ``record`` at its step and wall time."""
        writer = self._open()
        step, wall_time = record.step, record.wall_time
        if record.hyperparameters:
            writer.add_text("hyperparameters", _markdown_table(record.metrics), step, wall_time)
            return
        replayed = self._replayed
        for name, value in record.metrics.items():
            if replayed and replayed[(name, step)] > 0:
                replayed[(name, step)] -= 1  # written by the run that was killed
                continue
            if isinstance(value, bool | int | float):
                writer.add_scalar(name, float(value), step, wall_time)
            elif isinstance(value, torch.Tensor) and value.numel() == 1:
                writer.add_scalar(name, float(value.item()), step, wall_time)
            elif (
                isinstance(value, torch.Tensor)
                and value.numel() > 1
                and not value.is_complex()
                and bool(torch.isfinite(value).all())
            ):
                writer.add_histogram(name, value.detach().cpu(), step, walltime=wall_time)
            else:
                text = str(value.tolist()) if isinstance(value, torch.Tensor) else str(value)
                writer.add_text(name, text, step, wall_time)

    def state_dict(self) -> dict[str, Any]:
        """Flush the event file; the folder, its event files' lengths, the replays not seen.

        Called by :class:`~trainbus.callbacks.CheckpointSaver` on the training thread once
        every handler has run and every record logged before the checkpoint was written.
        """
        if self._writer is not None:
            self._writer.flush()
        pending = [[name, step] for (name, step), n in self._replayed.items() for _ in range(n)]
        return {
            "log_dir": os.path.abspath(self.log_dir),
            "files": event_files(self.log_dir),
            "pending": pending,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume into the checkpoint's folder; drop what the killed run wrote after it.

        The values in the folder's event files after the lengths the checkpoint recorded
        (and in files created after it), and those still pending at the checkpoint, are
        points the resumed run logs again; each is dropped once instead of written twice.
        """
        folder = state.get("log_dir")
        if not isinstance(folder, str):
            return
        if folder != os.path.abspath(self.log_dir):
            warnings.warn(
                f"TensorBoardLogger: resuming the run of the checkpoint, whose log_dir is "
                f"{folder!r}, instead of the log_dir={str(self.log_dir)!r} it was given "
                "(a resumed run keeps its folder; see docs/crash-consistency.md)",
                TrainbusWarning,
                stacklevel=2,
            )
            self.log_dir = Path(folder)
        replayed: Counter[tuple[str, int]] = Counter(
            (str(name), int(step)) for name, step in state.get("pending", [])
        )
        files = {str(k): int(v) for k, v in dict(state.get("files", {})).items()}
        replayed.update(events_after(self.log_dir, files))
        self._replayed = replayed

    def close(self, state: State, logger: Logger) -> None:
        """Flush and close the event file (runs also when training failed)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
