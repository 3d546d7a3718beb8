"""``WandBLogger``: metrics to a Weights & Biases run that a resumed run continues.

W&B is an optional dependency (``pip install 'trainbus[wandb]'``); ``wandb`` is imported
when a ``WandBLogger`` is made (on that thread: importing it beside another thread's
``ast.parse`` raised ``SystemError: AST constructor recursion depth mismatch`` on CPython
3.11.7), never when ``trainbus.loggers`` is.

What goes where: numbers (ints, floats, bools, one-element tensors) are logged as numbers,
other values as their JSON form (:func:`~trainbus.loggers.jsonl.to_json_value`), each
record with ``run.log(values, step=record.step)``: W&B gathers the values of one step in
one history row, written when a later step is logged (or at ``close``). Hyperparameters go
to ``run.config``.

Crash consistency (``docs/crash-consistency.md``, "The replay rule"): the W&B run id is
chosen when the logger is made (:attr:`WandBLogger.run_id`) and saved in every checkpoint;
a run resumed from a checkpoint calls ``wandb.init(id=<that id>, resume=...)`` and drops
every value at a step the W&B run already holds (the killed run's value stays). The last
step it holds is what W&B says: online, the resumed run's ``starting_step``; offline, the
history rows of the earlier offline folders of the same run id (``offline-run-*-<id>``)
in the same ``wandb`` folder, read from their ``.wandb`` transaction logs.

W&B writes its transaction log through a buffer (``x_transaction_log_flush_interval``,
15 s by default) and offers no call that flushes it, so a checkpoint cannot make W&B's
rows durable; it holds them itself instead. Each checkpoint (``state_dict``) reads how far
the run's own ``.wandb`` file has got (the last history step written to it, read from
where the previous checkpoint stopped) and saves every row this process logged after
that step: at most a flush interval of rows, the newest (which W&B writes only once a
later step is logged) included. A resumed run logs the saved rows above the step the W&B
run holds before anything else, so the rows up to the checkpoint are in the W&B run
whether or not W&B had flushed them when the process was killed.
"""

from __future__ import annotations

import importlib.util
import os
import re
import secrets
import string
import struct
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainbus.core.destination import LoggerDestination
from trainbus.core.logger import LogRecord
from trainbus.core.threads import start_thread
from trainbus.loggers.jsonl import to_json_value

if TYPE_CHECKING:
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["WandBLogger", "last_history_step", "offline_folders"]

#: An offline run folder's name: ``offline-run-<date>_<time>-<run id>[-<n>]``.
_OFFLINE_NAME = re.compile(r"offline-run-\d{8}_\d{6}-([^-]+)(?:-\d+)?")

_MISSING = (
    "WandBLogger needs the wandb package, which is not installed; "
    "install it with: pip install 'trainbus[wandb]'"
)
_RESUME = ("allow", "must")
_MODES = (None, "online", "offline", "disabled")
_ID_ALPHABET = string.ascii_lowercase + string.digits

# The .wandb transaction log: a 7-byte header (":W&B", a 2-byte magic, a version byte),
# then 32 KiB blocks of records, each a 7-byte header (CRC, 2-byte length, type: 1 full,
# 2 first, 3 middle, 4 last part) and a part of one serialized ``wandb_internal.Record``.
_BLOCK, _FILE_HEADER = 32 * 1024, 7
_RECORD_HEADER = struct.Struct("<IHB")
#: Rows kept before the logger reads how far W&B's transaction log has got (then twice
#: as many as are left): the rows a checkpoint saves are at most W&B's flush interval's.
_PRUNE_AT = 256


def _new_run_id() -> str:
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(8))


def _transaction_records(data: bytes, base: int = _FILE_HEADER) -> tuple[list[bytes], int]:
    """The complete records in ``data``, the bytes of a transaction log from file offset
    ``base`` on (a record's start), and the offset just after the last complete one (where
    a later read of the growing file starts again)."""
    records: list[bytes] = []
    pos, parts, done, end = base, b"", base, base + len(data)
    while pos + _RECORD_HEADER.size <= end:
        left = _BLOCK - pos % _BLOCK
        if left < _RECORD_HEADER.size:  # a block's tail too short for a header: padding
            pos += left
            continue
        _crc, length, kind = _RECORD_HEADER.unpack_from(data, pos - base)
        if length == 0 and kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        start = pos + _RECORD_HEADER.size
        if start + length > end:
            break  # a torn (or not yet written) last record
        chunk = data[start - base : start - base + length]
        pos = start + length
        if kind == 1:
            records.append(chunk)
            done = pos
        elif kind == 2:
            parts = chunk
        elif kind == 3:
            parts += chunk
        elif kind == 4:
            records.append(parts + chunk)
            parts, done = b"", pos
    return records, done


def _history_steps(records: list[bytes]) -> list[int]:
    """The steps of the history rows among ``records`` (damaged ones skipped, as W&B does)."""
    from wandb.proto import wandb_internal_pb2

    steps = []
    for raw in records:
        record: Any = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
        try:
            record.ParseFromString(raw)
        except Exception:  # a damaged record: skipped, like W&B's own reader
            continue
        if record.WhichOneof("record_type") == "history":
            steps.append(int(record.history.step.num))
    return steps


class _LogTail:
    """How far a run's own ``.wandb`` transaction log has got: the last history step W&B
    wrote to it. Each :meth:`advance` reads only what was written since the last one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = _FILE_HEADER  # the next unread record's start
        self.last: int | None = None

    def advance(self) -> int | None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return self.last
        records, self.offset = _transaction_records(data, self.offset)
        for step in _history_steps(records):
            self.last = step if self.last is None else max(self.last, step)
        return self.last


def offline_folders(wandb_dir: Path, run_id: str) -> list[Path]:
    """The offline folders of run ``run_id`` under ``wandb_dir``: ``offline-run-<time>-<id>``,
    and ``offline-run-<time>-<id>-<n>`` where W&B found the first name taken (a run of
    that id started in the same second)."""
    found = []
    for folder in wandb_dir.glob(f"offline-run-*-{run_id}*"):
        match = _OFFLINE_NAME.fullmatch(folder.name)
        if match is not None and match[1] == run_id:
            found.append(folder)
    return sorted(found)


def last_history_step(wandb_file: str | os.PathLike[str]) -> int | None:
    """The last history step written in a run's ``.wandb`` transaction log (or ``None``)."""
    return _LogTail(Path(wandb_file)).advance()


def _own_log(run: Any) -> _LogTail | None:
    """The tail of ``run``'s own transaction log, or ``None`` when it writes none."""
    settings = run.settings
    if getattr(run, "disabled", False) or settings.mode == "disabled":
        return None
    if getattr(settings, "x_skip_transaction_log", False):
        return None
    return _LogTail(Path(settings.sync_dir) / f"run-{settings.run_id}.wandb")


def _wandb_value(value: Any) -> Any:
    if isinstance(value, bool | int | float):
        return value
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        return value.item()
    return to_json_value(value)


class WandBLogger(LoggerDestination):
    """Logs metrics to a Weights & Biases run; a resumed run continues the same W&B run.

    Its methods are plain functions: they run on the destination's own thread, never on
    the training thread or the event loop. ``wandb.init`` (seconds) runs on a thread of
    its own, started at ``fit_start``; the records logged meanwhile wait in memory and are
    logged, in order, once the run is open; ``run.log`` hands the values to W&B's own
    service process. Under
    ``torchrun`` only rank zero logs, so a DDP job makes one W&B run.

    Args:
        project: The W&B project (``None``: W&B's default, e.g. ``WANDB_PROJECT``).
        entity: The W&B entity (user or team); ``None``: the default.
        name: The run's display name.
        run_id: The W&B run id to log into; by default a new id is chosen now. A
            checkpoint's id (a resumed run) replaces it.
        resume: ``"allow"`` (default: create the run if it does not exist) or
            ``"must"`` (online, fail when it does not), passed to ``wandb.init``.
        mode: ``"online"``, ``"offline"``, ``"disabled"``, or ``None`` (W&B's default:
            ``WANDB_MODE``, else online).
        dir: The folder W&B writes its ``wandb/`` folder in (``None``: ``WANDB_DIR``,
            else the current folder). A resumed offline run must see the same folder.
        config: Values for ``run.config``; hyperparameters logged later are added.
        settings: Keyword arguments for ``wandb.Settings``.

    Attributes:
        run_id: The W&B run id, known from construction, saved in every checkpoint.
        run: The ``wandb`` run once ``fit_start`` opened it, else ``None``.
        dropped: Values dropped because the W&B run already held their step (replays).

    Raises:
        ImportError: The ``wandb`` package is not installed (the message says how to
            install it).

    Example:
        >>> wandb_logger = WandBLogger("my-project", mode="offline")
        >>> trainer = Trainer(model, loader, "2ep", loggers=[wandb_logger])
        >>> trainer.fit_sync()
        >>> wandb_logger.run_id
        'k3x9q0ab'
    """

    rank_zero_only = True  # under torchrun: rank 0 only (docs/distributed.md)
    #: Its handlers read only their event's snapshot and the records it receives, never
    #: the live model: they may trail training by 2 batches (``docs/concurrency.md``,
    #: "Trailing handlers"). A subclass that reads live state sets ``trailing = None``.
    trailing = 2

    def __init__(
        self,
        project: str | None = None,
        *,
        entity: str | None = None,
        name: str | None = None,
        run_id: str | None = None,
        resume: str = "allow",
        mode: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        config: dict[str, Any] | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        for arg, value in (("project", project), ("entity", entity), ("name", name)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{arg}={value!r} must be a str or None")
        if run_id is not None and (not isinstance(run_id, str) or not run_id):
            raise ValueError(f"run_id={run_id!r} must be a non-empty str, e.g. 'k3x9q0ab'")
        if resume not in _RESUME:
            raise ValueError(f"resume={resume!r} must be 'allow' or 'must'")
        if mode not in _MODES:
            raise ValueError(f"mode={mode!r} must be 'online', 'offline', 'disabled' or None")
        if dir is not None and not isinstance(dir, str | os.PathLike):
            raise TypeError(f"dir={dir!r} must be a str, a path or None")
        if config is not None and not isinstance(config, dict):
            raise TypeError(f"config={config!r} must be a dict or None")
        if settings is not None and not isinstance(settings, dict):
            raise TypeError(f"settings={settings!r} must be a dict or None")
        if importlib.util.find_spec("wandb") is None:
            raise ImportError(_MISSING)
        try:  # here, on the thread that makes the logger, before any lane thread runs:
            import wandb  # noqa: F401  # its import (pydantic's ast.parse) is not thread-safe
        except ImportError as exc:  # on CPython 3.11.7 beside another thread's ast.parse
            raise ImportError(_MISSING) from exc
        self.project, self.entity, self.name = project, entity, name
        self.run_id: str = run_id if run_id is not None else _new_run_id()
        self.resume, self.mode = resume, mode
        self.dir = None if dir is None else Path(dir)
        self.config = dict(config or {})
        self.settings = dict(settings or {})
        self.run: Any = None
        self.dropped = 0
        self._resumed = False
        self._floor: int | None = None  # the last step the W&B run held when it was opened
        self._lock = threading.Lock()
        self._opener: threading.Thread | None = None
        self._waiting: list[LogRecord] = []  # records logged while wandb.init runs
        self._error: BaseException | None = None
        # Crash consistency: the rows logged that W&B may not have written to the run's
        # transaction log yet (saved in each checkpoint), and a checkpoint's, to log again.
        self._tail: _LogTail | None = None
        self._rows: list[tuple[int, dict[str, Any]]] = []
        self._prune_at = _PRUNE_AT
        self._newest: int | None = None  # the newest step logged (W&B's current row)
        self._restored: list[tuple[int, dict[str, Any]]] = []

    def _init_run(self) -> Any:
        try:
            import wandb
        except ImportError as exc:
            raise ImportError(_MISSING) from exc
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
        return wandb.init(
            project=self.project,
            entity=self.entity,
            name=self.name,
            id=self.run_id,
            resume=self.resume,  # type: ignore[arg-type]  # checked in __init__
            mode=self.mode,  # type: ignore[arg-type]
            dir=None if self.dir is None else str(self.dir),
            config=self.config or None,
            settings=wandb.Settings(**self.settings),
            reinit="create_new",  # one process may hold several runs (no global run)
        )

    def _opening(self) -> None:
        """The opener thread: ``wandb.init``, the replay floor, then the records that
        arrived meanwhile, in order (under the lock, so none overtakes them)."""
        try:
            run = self._init_run()
            floor = self._held_step(run) if self._resumed else None
        except BaseException as exc:
            with self._lock:
                self._error = exc
            return
        with self._lock:
            self.run, self._floor = run, floor
            self._tail, self._rows, self._prune_at = _own_log(run), [], _PRUNE_AT
            self._newest = None
            restored, self._restored = self._restored, []
            waiting, self._waiting = self._waiting, []
            try:
                for step, values in restored:  # the checkpoint's rows W&B does not hold
                    if floor is None or step > floor:
                        run.log(values, step=step)
                        self._keep(step, values)
                for record in waiting:
                    self._write(record)
            except BaseException as exc:
                self._error = exc

    def _start(self) -> None:
        """Open the run on a thread of its own (once per ``fit()``)."""
        if self._opener is None:
            opener = threading.Thread(target=self._opening, name="trainbus-wandb-init", daemon=True)
            self._opener = start_thread(opener, needed="It opens the W&B run beside training")

    def _held_step(self, run: Any) -> int | None:
        """The last step the W&B run holds already (killed runs' rows), or ``None``."""
        if not run.offline:
            starting = int(run.starting_step or 0)  # online: W&B's server tells
            return starting - 1 if starting > 0 else None
        own = Path(run.settings.sync_dir).name
        steps = [
            last_history_step(folder / f"run-{self.run_id}.wandb")
            for folder in offline_folders(Path(run.settings.wandb_dir), self.run_id)
            if folder.name != own
        ]
        known = [s for s in steps if s is not None]
        return max(known) if known else None

    def fit_start(self, state: State, logger: Logger) -> None:
        """Start opening the W&B run (resumed into the checkpoint's run id when there is
        one) on a thread of its own: ``wandb.init`` takes seconds, and the records logged
        meanwhile wait in memory, so no barrier waits for it."""
        self._start()

    def log_record(self, record: LogRecord) -> None:
        """``run.log`` the record's values at its step; hyperparameters to ``run.config``.

        A value at a step the W&B run already held when this run opened it is dropped
        (the replay rule: the killed run's value stays). While the run is being opened,
        the record waits in memory.

        Raises:
            BaseException: Opening the run failed (``wandb.init``'s error).
        """
        self._start()  # also for records logged before fit_start (at INIT)
        with self._lock:
            error, self._error = self._error, None
            if error is not None:  # raised once (by a record or by close), not twice
                raise error
            if self.run is None:
                self._waiting.append(record)
                return
            self._write(record)

    def _write(self, record: LogRecord) -> None:
        run = self.run
        if record.hyperparameters:
            values = {name: to_json_value(v) for name, v in record.metrics.items()}
            run.config.update(values, allow_val_change=True)
            return
        floor = self._floor
        if floor is not None and record.step <= floor:
            self.dropped += len(record.metrics)
            return
        values = {name: _wandb_value(v) for name, v in record.metrics.items()}
        run.log(values, step=record.step)
        self._keep(record.step, values)

    def _keep(self, step: int, values: dict[str, Any]) -> None:
        """Remember a logged row until W&B has written it to the transaction log."""
        if self._tail is None:
            return
        rows, newest = self._rows, self._newest
        if newest is not None and step < newest:
            return  # W&B drops it too ("step must only increase")
        if newest == step and rows and rows[-1][0] == step:
            rows[-1][1].update(values)
        elif newest != step:
            rows.append((step, dict(values)))
        self._newest = step
        if len(rows) >= self._prune_at:
            self._prune()
            self._prune_at = max(_PRUNE_AT, 2 * len(self._rows))

    def _prune(self) -> None:
        """Forget the rows W&B has written to the run's transaction log."""
        if self._tail is None:
            return
        written = self._tail.advance()
        if written is not None:
            self._rows = [(step, values) for step, values in self._rows if step > written]

    def state_dict(self) -> dict[str, Any]:
        """The W&B run's id (and project, entity), and the rows W&B has not written yet.

        A resumed run logs into that run, and logs the saved rows the W&B run does not
        hold (``rows``: ``[step, {name: value}]``, the rows this process logged after the
        last history step in the run's ``.wandb`` file, read now).

        Called by :class:`~trainbus.callbacks.CheckpointSaver` on the training thread; while
        the run is still being opened it waits for ``wandb.init`` and for the records kept
        meanwhile to be handed to W&B, so a checkpoint never precedes records it counts as
        logged (only a checkpoint during ``wandb.init`` waits)."""
        opener = self._opener
        if opener is not None and opener is not threading.current_thread():
            opener.join()
        with self._lock:
            self._prune()
            rows = [[step, dict(values)] for step, values in self._rows]
            rows += [[step, dict(values)] for step, values in self._restored]
        return {
            "run_id": self.run_id, "project": self.project, "entity": self.entity,
            "rows": rows,
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: log into the checkpoint's W&B run, dropping the steps it holds."""
        run_id = state.get("run_id")
        if isinstance(run_id, str) and run_id and self.run is None:
            self.run_id = run_id
            self._resumed = True
            self._restored = [(int(step), dict(values)) for step, values in state.get("rows", [])]

    def close(self, state: State, logger: Logger) -> None:
        """Wait for the run to be open, then finish it (W&B writes its last history
        row); runs also when training failed.

        Raises:
            BaseException: Opening the run failed (``wandb.init``'s error).
        """
        opener, self._opener = self._opener, None
        if opener is not None:
            opener.join()
        with self._lock:
            run, self.run = self.run, None
            error, self._error = self._error, None
        if run is not None:
            run.finish()
        if error is not None:
            raise error
