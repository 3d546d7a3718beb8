"""The logger callbacks write to, and the records it makes.

``logger.log_metrics(...)`` never does I/O: it copies the values into a
:class:`LogRecord` and queues the record on every destination's lane, in order. The
destinations are callbacks (``destination.py``), so their ``log_metrics`` may be
``async def`` and runs concurrently with training and with the other destinations.
"""

from __future__ import annotations

import math
import operator
import os
import shutil
import sys
import threading
import time
from _thread import get_ident
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainbus.core.scalars import copy_value, resolve_value
from trainbus.core.state import _StateView
from trainbus.core.time import Time

if TYPE_CHECKING:
    from trainbus.core.state import State
    from trainbus.core.timer import Timestamp

__all__ = ["LogLevel", "LogRecord", "Logger"]


class LogLevel(IntEnum):
    """How often a value is logged, as in Composer v0.6.

    Accepts names and ints: ``LogLevel("batch")``, ``LogLevel["BATCH"]``, ``LogLevel(3)``.
    """

    FIT = 1
    EPOCH = 2
    BATCH = 3
    MICROBATCH = 4

    @classmethod
    def _missing_(cls, value: object) -> LogLevel:
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        names = ", ".join(repr(level.name.lower()) for level in cls)
        raise ValueError(
            f"log level {value!r} is not a LogLevel; use one of {names} "
            f"(or its number, 1-{len(cls)}), e.g. LogLevel.BATCH"
        )


def _to_level(value: LogLevel | int | str) -> LogLevel:
    """``value`` as a :class:`LogLevel`; raises ``ValueError`` naming the valid levels."""
    if isinstance(value, LogLevel):
        return value
    if type(value) is int and value in LogLevel._value2member_map_:
        return LogLevel(value)
    return LogLevel._missing_(value)


@dataclass(slots=True)
class LogRecord:
    """One ``log_metrics`` (or ``log_hyperparameters``) call, as destinations receive it.

    Attributes:
        metrics: Names to values; tensors were copied, GPU scalars arrive as floats.
        step: The step the values belong to (default: the batch count of the event).
        wall_time: ``time.time()`` when the values were logged.
        level: The :class:`LogLevel`.
        timestamp: The run's counters when the values were logged.
        hyperparameters: Whether this record holds hyperparameters, not metrics.

    The :attr:`state` property is the state as of the event whose handler logged the
    values (a snapshot: ``state.timer``, ``state.batch``, ``state.loss``, ... are that
    event's), what a Composer ``log_data(state, log_level, data)`` receives.
    """

    metrics: dict[str, Any]
    step: int
    wall_time: float
    level: LogLevel = LogLevel.BATCH
    timestamp: Timestamp | None = None
    hyperparameters: bool = False
    _resolved: bool = field(default=False, repr=False, compare=False)
    # The logger's state and, when that is the live state, its per-batch frame then: the
    # snapshot is built only when a destination asks for it (log_data), not per record.
    _live: State | None = field(default=None, repr=False, compare=False)
    _frame: Any = field(default=None, repr=False, compare=False)

    @property
    def state(self) -> State | None:
        """The state as of the record's event (``None`` for a record built by hand)."""
        live, frame = self._live, self._frame
        if live is None or frame is None or self.timestamp is None:
            return live  # a handler's logger: its state is that event's snapshot already
        return _StateView(live, frame, self.timestamp)

    def resolve(self) -> LogRecord:
        """Turn deferred GPU scalars into floats (may wait for the device copy)."""
        if not self._resolved:
            self.metrics = {k: resolve_value(v) for k, v in self.metrics.items()}
            self._resolved = True
        return self


#: Set in a forked child process (a DataLoader worker): there, the loggers built before the
#: fork are copies whose records could reach no destination (``Logger._emit``).
_forked = False


def _mark_forked() -> None:
    global _forked
    _forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_mark_forked)

_IN_CHILD = (
    "logger.log_metrics was called in a forked child process (pid {pid}: a DataLoader worker, "
    "or a multiprocessing worker), where the trainer's destinations do not exist: the record "
    "would be lost. Log from the training process instead: return the values with the batch "
    "(or through a multiprocessing.Queue) and log them from a handler or a thread there "
    "(docs/loggers.md, 'Logging from anywhere')"
)


class _Hub:
    """What all loggers bound from one trainer share: the bus's sink, or a backlog.

    Any thread or task may log (``docs/loggers.md``, "Logging from anywhere"). A caller
    first enters ``inside`` (its thread's id), *then* reads ``sink``; a disconnect first
    clears ``sink``, *then* waits until ``inside`` is empty (:meth:`wait_idle`). So every
    call that saw the sink is waited for, and every later one sees none: no record reaches
    the bus after its disconnect. Those steps are single dict and attribute operations,
    atomic in CPython, so the path of a call with the bus connected takes no lock (a lock
    pair costs a record more than the rest of its path). Choosing the backlog, and
    connecting, run under ``lock``: a caller's records keep their order across a connect.
    """

    __slots__ = ("backlog", "inside", "left", "lock", "pid", "sink", "taps")

    def __init__(self) -> None:
        self.pid = os.getpid()  # the process whose bus the records can reach
        self.sink: Callable[[LogRecord], None] | None = None
        self.backlog: list[LogRecord] = []
        self.lock = threading.Lock()
        #: The threads inside the sink now (each at most once: the sink does not log).
        self.inside: dict[int, bool] = {}
        #: Set by a caller leaving the sink after a disconnect.
        self.left = threading.Event()
        #: Called with each record on the logging thread, before the bus sees it
        #: (:meth:`Logger._tap`); empty, it costs a record one truth test.
        self.taps: tuple[Callable[[LogRecord], None], ...] = ()

    def wait_idle(self, timeout: float) -> bool:
        """Block until no call is inside the sink (or ``timeout`` seconds); true if none
        is. Call it after clearing ``sink``."""
        deadline = time.monotonic() + timeout
        while self.inside:
            self.left.clear()
            if not self.inside:  # left between the two looks: its set() came before clear()
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.left.wait(remaining)
        return True


DataArg = Mapping[str, Any] | Callable[[], Mapping[str, Any]]


#: Types whose values :func:`copy_value` returns as they are.
_PLAIN = frozenset({float, int, str, bool, type(None)})


def _copy_metrics(values: Mapping[Any, Any], call: str) -> dict[str, Any]:
    """Copies of ``values``; every key must be a ``str`` (no silent ``str(key)``)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if type(key) is str and type(value) in _PLAIN:  # most values: 4x cheaper this way
            out[key] = value
            continue
        if type(key) is not str and not isinstance(key, str):
            clash = [k for k in values if k is not key and str(k) == str(key)]
            also = (
                f"; {key!r} and {clash[0]!r} would both be named {str(key)!r}, one value lost"
                if clash else ""
            )
            raise TypeError(
                f"{call}: metric names must be str, got the key {key!r} "
                f"({type(key).__qualname__}){also}; use str keys, e.g. {{{str(key)!r}: ...}}"
            )
        out[key if type(key) is str else str(key)] = copy_value(value)  # str subclasses too
    return out


def _check_step(step: Any) -> int:
    """``step`` as an ``int``: ints (numpy's too), 0-d integer tensors, a count ``Time``."""
    if not isinstance(step, bool):
        if isinstance(step, Time) and isinstance(step.value, int):
            return step.value
        try:
            return operator.index(step)
        except TypeError:
            pass
    hint = ""
    if isinstance(step, float) and math.isfinite(step):
        hint = f" (round it yourself, e.g. step={round(step)})"
    raise TypeError(
        f"log_metrics(step={step!r}): step must be an int{hint}, "
        "or None for the batch count of the caller's event"
    )


#: The artifact folders noted this process (one note each, :func:`_note_artifacts`).
_noted: set[Path] = set()
_noted_lock = threading.Lock()


def _note_artifacts(folder: Path) -> None:
    """Say once per folder where ``logger.file_artifact`` stores files (stderr)."""
    with _noted_lock:
        if folder in _noted:
            return
        _noted.add(folder)
    sys.stderr.write(
        f"trainbus: logger.file_artifact stores artifacts under {folder}/ (no destination of "
        "this run uploads artifacts: upload that folder, or take checkpoint files from "
        "CheckpointSaver.add_listener(fn))\n"
    )


def _refuse_existing(path: Path, name: str, overwrite: bool, call: str) -> None:
    if not overwrite and (path.exists() or path.is_symlink()):
        raise FileExistsError(
            f"logger.{call}: artifact {name!r} exists ({path}); pass overwrite=True to "
            "replace it"
        )


class Logger:
    """Where callbacks log metrics; it forwards copies to every destination.

    A handler's ``logger`` argument is bound to the handler's event, so the default
    ``step`` is the batch count of that event even when the handler runs late.

    Example:
        >>> class LogLoss(Callback):
        ...     def after_loss(self, state, logger):
        ...         logger.log_metrics({"loss": state.loss})   # no .item(): no GPU sync
    """

    def __init__(self, state: State) -> None:
        self._state = state
        self._hub = _Hub()

    def _bind(self, state: State) -> Logger:
        """A logger sharing this one's destinations, with ``state`` for default steps."""
        bound = Logger.__new__(Logger)
        bound._state = state
        bound._hub = self._hub
        return bound

    def _emit(self, record: LogRecord) -> None:
        hub = self._hub
        if _forked and hub.pid != os.getpid():  # a copy of the trainer's, in a forked child
            raise RuntimeError(_IN_CHILD.format(pid=os.getpid()))
        if hub.taps:
            for tap in hub.taps:
                tap(record)
        inside, me = hub.inside, get_ident()
        inside[me] = True  # before the look at the sink (see _Hub)
        try:
            sink = hub.sink
            if sink is not None:
                sink(record)
                return
        finally:
            del inside[me]
            if hub.sink is None:  # a disconnect may wait for this call
                hub.left.set()
        with hub.lock:  # no bus: the backlog, unless one connected meanwhile
            sink = hub.sink
            if sink is None:
                hub.backlog.append(record)
                return
        self._emit(record)

    def _tap(self, fn: Callable[[LogRecord], None]) -> None:
        """Call ``fn(record)`` with every record logged from now on, on the logging thread,
        before the bus sees it (a private hook: ``RunWatch`` keeps the latest scalars so,
        without a lane of its own). ``fn`` must be cheap and must not raise or log."""
        self._hub.taps = (*self._hub.taps, fn)

    def _connect(self, sink: Callable[[LogRecord], None]) -> None:
        """Connect the bus and hand it the records logged while none was connected (the
        backlog), oldest first, before any record logged from now on: under the lock, so
        a caller's records keep their order across the connect. ``sink`` must not block
        here (the bus calls this on the loop, where records never wait for room)."""
        hub = self._hub
        with hub.lock:
            backlog, hub.backlog = hub.backlog, []
            for record in backlog:
                sink(record)
            hub.sink = sink

    def _disconnect(self) -> None:
        """Disconnect the bus: records logged from now on wait in the backlog, for the
        next :meth:`_connect` (the next ``fit()``). Calls already inside the sink finish
        there (wait for them with :meth:`_Hub.wait_idle`)."""
        with self._hub.lock:
            self._hub.sink = None

    def log_metrics(
        self,
        metrics: Mapping[str, Any],
        step: int | None = None,
        *,
        level: LogLevel | int | str = LogLevel.BATCH,
    ) -> None:
        """Log ``metrics`` (names to numbers or tensors) at ``step``.

        Values are copied, so the caller may reuse its objects; tensors are not
        synchronised with the device here. Returns at once: destinations receive the
        values on their own lanes, in the order they were logged.

        Args:
            metrics: Names to values.
            step: The step, an ``int``; defaults to ``int(state.timer.batch)`` of the
                caller's event.
            level: The :class:`LogLevel` recorded with the values.

        Raises:
            TypeError: ``metrics`` is not a mapping, a key is not a ``str`` (the error
                names the key, and any other key it would collide with as a string), or
                ``step`` is not an ``int`` (``1.7`` is not silently truncated).
        """
        if not isinstance(metrics, Mapping):
            raise TypeError(
                f"log_metrics(metrics=...) takes a mapping of names to values, "
                f"got {type(metrics).__qualname__}; wrap the value: {{'name': value}}"
            )
        state = self._state
        ts = state.timestamp
        record = LogRecord(
            metrics=_copy_metrics(metrics, "log_metrics(metrics=...)"),
            step=int(ts.batch) if step is None else _check_step(step),
            wall_time=time.time(),
            level=_to_level(level),
            timestamp=ts,
            _live=state,
            _frame=None if isinstance(state, _StateView) else state._frame,
        )
        self._emit(record)

    def log_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        """Log the run's hyperparameters (copied) to every destination.

        Raises:
            TypeError: ``hyperparameters`` is not a mapping, or a key is not a ``str``.
        """
        if not isinstance(hyperparameters, Mapping):
            raise TypeError(
                "log_hyperparameters(...) takes a mapping of names to values, "
                f"got {type(hyperparameters).__qualname__}; e.g. {{'lr': 0.1}}"
            )
        state = self._state
        ts = state.timestamp
        self._emit(
            LogRecord(
                metrics=_copy_metrics(hyperparameters, "log_hyperparameters(...)"),
                step=int(ts.batch),
                wall_time=time.time(),
                level=LogLevel.FIT,
                timestamp=ts,
                hyperparameters=True,
                _live=state,
                _frame=None if isinstance(state, _StateView) else state._frame,
            )
        )

    @property
    def run_name(self) -> str:
        """The run's name (``Trainer(run_name=...)``), as Composer's ``logger.run_name``."""
        name: str = self._state.run_name
        return name

    @property
    def artifact_folder(self) -> Path:
        """Where :meth:`file_artifact` stores files: ``<run_name>/artifacts`` under the
        working directory (Composer v0.6's ``FileLogger`` writes ``<run_name>/logs-...``
        beside it)."""
        return Path(self.run_name) / "artifacts"

    def file_artifact(self, log_level: LogLevel | int | str, artifact_name: str,
                      file_path: str | os.PathLike[str], *,
                      overwrite: bool = False) -> Path:  # fmt: skip
        """Composer v0.6's artifact call: store a copy of ``file_path`` as ``artifact_name``.

        The copy goes to :attr:`artifact_folder` (``<run_name>/artifacts/<artifact_name>``;
        ``{run_name}`` and ``{rank}`` in the name are filled in), written whole and then
        renamed, so a reader never sees half a file and the caller may delete or rewrite
        its file at once. No built-in destination uploads artifacts: the first call of a
        run prints one note saying where they are (upload that folder, or take checkpoint
        files from ``CheckpointSaver.add_listener``). Safe from any handler's thread.

        Args:
            log_level: The call's :class:`LogLevel` (checked, not used).
            artifact_name: A relative name, e.g. ``"{run_name}/logs-rank0.txt"``.
            file_path: The file to store.
            overwrite: Replace an artifact of that name (Composer's ``FileLogger`` passes
                ``True`` at each flush).

        Returns:
            The stored copy's path.

        Raises:
            ValueError: ``artifact_name`` is empty, absolute or leaves the folder (``..``).
            FileNotFoundError: ``file_path`` is not a file.
            FileExistsError: The artifact exists and ``overwrite`` is false.

        Example:
            >>> logger.file_artifact(LogLevel.FIT, "config.yaml", "config.yaml")
            PosixPath('my-run/artifacts/config.yaml')
        """
        _to_level(log_level)
        target = self._artifact_path(artifact_name, "artifact_name")
        source = Path(file_path)
        if not source.is_file():
            raise FileNotFoundError(
                f"logger.file_artifact({artifact_name!r}, file_path={str(file_path)!r}): no "
                "such file; pass the path of a file that exists"
            )
        _refuse_existing(target, artifact_name, overwrite, "file_artifact")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.part")
        shutil.copyfile(source, partial)
        os.replace(partial, target)
        _note_artifacts(self.artifact_folder.absolute())
        return target

    def symlink_artifact(self, log_level: LogLevel | int | str, existing_artifact_name: str,
                         symlink_artifact_name: str, overwrite: bool = False) -> Path:  # fmt: skip
        """Composer v0.6's artifact call: name a stored artifact a second way.

        Makes ``symlink_artifact_name`` in :attr:`artifact_folder` a symbolic link to the
        artifact :meth:`file_artifact` stored as ``existing_artifact_name`` (relative, so
        the folder can be moved or uploaded whole).

        Returns:
            The link's path.

        Raises:
            ValueError: A name is empty, absolute or leaves the folder.
            FileNotFoundError: No artifact ``existing_artifact_name`` was stored.
            FileExistsError: ``symlink_artifact_name`` exists and ``overwrite`` is false.

        Example:
            >>> logger.symlink_artifact(LogLevel.FIT, "ep1.pt", "latest.pt", overwrite=True)
            PosixPath('my-run/artifacts/latest.pt')
        """
        _to_level(log_level)
        existing = self._artifact_path(existing_artifact_name, "existing_artifact_name")
        link = self._artifact_path(symlink_artifact_name, "symlink_artifact_name")
        if not existing.exists():
            raise FileNotFoundError(
                f"logger.symlink_artifact({existing_artifact_name!r}, "
                f"{symlink_artifact_name!r}): no artifact {existing_artifact_name!r} in "
                f"{self.artifact_folder}; store it first with logger.file_artifact(...)"
            )
        _refuse_existing(link, symlink_artifact_name, overwrite, "symlink_artifact")
        link.parent.mkdir(parents=True, exist_ok=True)
        partial = link.with_name(f".{link.name}.{os.getpid()}.{threading.get_ident()}.part")
        os.symlink(os.path.relpath(existing, link.parent), partial)
        os.replace(partial, link)
        return link

    def _artifact_path(self, name: str, argument: str) -> Path:
        """``name`` (with ``{run_name}``/``{rank}`` filled in) under the artifact folder."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{argument}={name!r} must be a relative file name, e.g. 'log.txt'")
        rank = str(getattr(self._state, "rank", 0))
        filled = name.replace("{run_name}", self.run_name).replace("{rank}", rank)
        relative = Path(filled.lstrip("/"))
        if Path(filled).is_absolute() or ".." in relative.parts:
            raise ValueError(
                f"{argument}={name!r} must stay inside the run's artifact folder: a relative "
                "name without '..', e.g. 'logs/rank0.txt'"
            )
        return self.artifact_folder / relative

    @property
    def destinations(self) -> tuple[Any, ...]:
        """The run's logger destinations (:class:`~trainbus.LoggerDestination`), in the order
        they receive records (Composer's)."""
        return tuple(cb for cb in self._state.callbacks if getattr(cb, "_receives_records", False))

    @destinations.setter
    def destinations(self, value: Any) -> None:
        raise AttributeError(
            "logger.destinations cannot be assigned: the trainer resolves its destinations "
            "once, when it is built (they see INIT in its constructor); pass them as "
            "Trainer(loggers=[dest, ...]) (or Bus(loggers=[...])) instead"
        )

    # -- Composer v0.6 API ------------------------------------------------------------------

    def data(self, log_level: LogLevel | int | str, data: DataArg) -> None:
        """Log ``data`` (a dict, or a callable returning one) at ``log_level``.

        Composer v0.6's logging call: the values are logged as :meth:`log_metrics`
        would, at the batch of the caller's event, with ``log_level`` recorded.

        Example:
            >>> logger.data("epoch", {"accuracy": 0.9})
            >>> logger.data_batch(lambda: {"lr": optimizer.param_groups[0]["lr"]})
        """
        level = _to_level(log_level)
        values = data() if callable(data) else data
        if not isinstance(values, Mapping):
            got = type(values).__qualname__
            raise TypeError(
                f"logger.data(data=...) takes a dict of names to values, or a callable "
                f"returning one; got {got}; wrap the value: {{'name': value}}"
            )
        self.log_metrics(values, level=level)

    def data_fit(self, data: DataArg) -> None:
        """Log ``data`` at :attr:`LogLevel.FIT`."""
        self.data(LogLevel.FIT, data)

    def data_epoch(self, data: DataArg) -> None:
        """Log ``data`` at :attr:`LogLevel.EPOCH`."""
        self.data(LogLevel.EPOCH, data)

    def data_batch(self, data: DataArg) -> None:
        """Log ``data`` at :attr:`LogLevel.BATCH`."""
        self.data(LogLevel.BATCH, data)


# Shown as ``trainbus.X`` in tracebacks and reprs (each is exported there; pickling works).
LogLevel.__module__ = "trainbus"
LogRecord.__module__ = "trainbus"
Logger.__module__ = "trainbus"
