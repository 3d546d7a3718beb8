"""``CheckpointSaver``: checkpoints captured on the training thread, written beside it.

At a due ``BATCH_CHECKPOINT`` / ``EPOCH_CHECKPOINT`` the saver's ``@blocking`` handler runs on
the training thread itself and takes a consistent copy of the run in host memory
(:func:`trainbus.checkpoint.format.capture`). A writer thread owned by the saver then serialises,
writes, ``fsync``s and renames it into place while training goes on. One save is in flight at a
time: a save that comes due while the previous one is still being written *waits* for it (no
checkpoint is ever skipped). ``docs/checkpoints.md`` explains the guarantees.
"""

from __future__ import annotations

import pathlib
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainbus.callbacks._interval import Interval
from trainbus.checkpoint import abandoned as _abandoned
from trainbus.checkpoint import sharded as _dcp
from trainbus.checkpoint.cleanup import remove_checkpoint, remove_stale_partials, template_folders
from trainbus.checkpoint.format import BufferPool, Capture, capture
from trainbus.checkpoint.resume import epoch_rng, wait_for_handlers
from trainbus.core.callback import Callback, blocking
from trainbus.core.events import Event
from trainbus.core.exceptions import CheckpointWarning
from trainbus.core.threads import start_thread
from trainbus.core.time import Time
from trainbus.core.timer import Timestamp
from trainbus.runtime import gloo_exit as _gloo_exit

if TYPE_CHECKING:
    import os

    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["CheckpointSaver", "SaverStatistics"]

_WRITER_ROLE = "It writes the CheckpointSaver's checkpoints beside training"
_INTERVAL_EVENT = {Event.BATCH_CHECKPOINT: Event.BATCH_END, Event.EPOCH_CHECKPOINT: Event.EPOCH_END}


@dataclass(frozen=True, slots=True)
class SaverStatistics:
    """What checkpointing cost so far (seconds are wall-clock).

    Attributes:
        saves: Checkpoints captured (written or being written).
        written: Checkpoints complete on disk.
        capture_seconds: Total time the training thread spent capturing (the host copy).
        capture_seconds_max: The longest single capture.
        wait_seconds: Total time the training thread waited for the previous write.
        write_seconds: Total time the writer spent serialising, writing and renaming.
        bytes_written: Total size of the files written.
        host_bytes: Tensor bytes copied to host memory by the last capture.
    """

    saves: int
    written: int
    capture_seconds: float
    capture_seconds_max: float
    wait_seconds: float
    write_seconds: float
    bytes_written: int
    host_bytes: int


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class CheckpointSaver(Callback):
    """Saves checkpoints without making training wait for the disk.

    Each checkpoint holds the model, optimizers, schedulers, the grad scaler (if the
    state has one), the timer, the random generators of Python, NumPy, torch and CUDA,
    the position in the training data and every callback's ``state_dict()`` (keyed by
    class and occurrence, so two instances of one class do not collide). Resume with
    ``Trainer(load_path=file_or_folder)``.

    The training thread pays only for the copy to host memory (on CUDA the copy is
    queued on the stream and the writer waits for it); serialising, writing, ``fsync``
    and the atomic rename happen on the saver's writer thread. A crash never leaves a
    torn file under a checkpoint's name. A write error is raised from ``fit()`` (at the
    next checkpoint event, or at close); ``close`` waits for the last write.

    With an FSDP model it runs on every rank and each checkpoint is a folder of
    ``torch.distributed.checkpoint`` shards (``docs/distributed.md``, "FSDP checkpoints").

    Args:
        folder: Where checkpoints are written (created if missing).
        filename: The file name, formatted with ``{epoch}``, ``{batch}``, ``{rank}``
            (and ``{sample}``, ``{token}``, ``{batch_in_epoch}``); may contain ``/``.
        save_interval: ``"1ep"``, ``"100ba"``, ``"0.25dur"``, an int (epochs), or a
            function ``(state, event) -> bool`` called at each checkpoint event.
        overwrite: Replace an existing file of the same name; when ``False`` a save onto
            an existing file raises ``FileExistsError``.
        num_checkpoints_to_keep: Keep the newest ``n`` checkpoints written by this
            saver and delete older ones; ``-1`` keeps all.
        weights_only: Save the model's weights (and timestamp) only.

    Attributes:
        saved_checkpoints: ``(timestamp, [paths])`` of each checkpoint complete on disk,
            oldest first (pruned ones are removed).

    Example:
        >>> from trainbus.callbacks import CheckpointSaver
        >>> saver = CheckpointSaver("ckpt", save_interval="100ba", num_checkpoints_to_keep=3)
        >>> Trainer(model, loader, "2ep", callbacks=[saver]).fit_sync()
        >>> Trainer(model, loader, "4ep", load_path="ckpt").fit_sync()  # resumes
    """

    rank_zero_only = True  # under torchrun: rank 0 only (docs/distributed.md)
    writes_shards_when_sharded = True  # ...but every rank with an FSDP model (its shards)

    def __init__(
        self,
        folder: str | os.PathLike[str] = "checkpoints",
        filename: str = "ep{epoch}-ba{batch}-rank{rank}.pt",
        save_interval: Time[Any] | str | int | Callable[[State, Event], bool] = "1ep",
        *,
        overwrite: bool = False,
        num_checkpoints_to_keep: int = -1,
        weights_only: bool = False,
    ) -> None:
        self.folder = pathlib.Path(folder)
        if not isinstance(filename, str) or not filename:
            raise TypeError(f"filename={filename!r} must be a str, e.g. 'ep{{epoch}}.pt'")
        try:
            filename.format(**dict.fromkeys(Timestamp().state_dict(), 0), rank=0)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"filename={filename!r} has a field trainbus does not fill ({exc}); use "
                "{epoch}, {batch}, {rank}, {sample}, {token} or {batch_in_epoch}"
            ) from None
        self.filename = filename
        self._subfolders = template_folders(filename)  # where its temporary files may be
        self._due_fn: Callable[[State, Event], bool] | None = None
        self._interval: Interval | None = None
        if callable(save_interval):
            self._due_fn = save_interval
        else:
            self._interval = Interval(save_interval, name="save_interval")
        if (
            isinstance(num_checkpoints_to_keep, bool)
            or not isinstance(num_checkpoints_to_keep, int)
            or num_checkpoints_to_keep == 0
            or num_checkpoints_to_keep < -1
        ):
            raise ValueError(
                f"num_checkpoints_to_keep={num_checkpoints_to_keep!r} must be -1 (keep all) "
                "or a positive int, e.g. 3"
            )
        self.overwrite = bool(overwrite)
        self.num_checkpoints_to_keep = num_checkpoints_to_keep
        self.weights_only = bool(weights_only)
        self._lock = threading.Condition()
        self._saved: list[tuple[Timestamp, list[pathlib.Path]]] = []
        self._job: tuple[Capture | _dcp.ShardedSave, Timestamp, pathlib.Path] | None = None
        self._sharded, self._group = False, None  # FSDP: DCP folders, DCP's process group
        self._capturing: tuple[Timestamp, pathlib.Path] | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._closing = False
        self._save_requested = False  # request_save(): at the next checkpoint event or FIT_END
        self._trained = True  # a batch ended in this fit() (FIT_START resets it)
        self._closed = False  # close() ran (FIT_START resets it)
        self._requested_captured = threading.Event()  # that save is captured (or none asked)
        self._requested_captured.set()
        self._pool: BufferPool = {}  # host buffers of the last write, reused by the next capture
        self._listeners: list[Callable[[Timestamp, pathlib.Path], None]] = []
        stats = ("saves", "written", "capture", "capture_max", "wait", "write", "bytes", "host")
        self._stats = dict.fromkeys(stats, 0.0)

    # -- public ------------------------------------------------------------------------------

    @property
    def saved_checkpoints(self) -> list[tuple[Timestamp, list[pathlib.Path]]]:
        """``(timestamp, [paths])`` of each checkpoint complete on disk, oldest first."""
        with self._lock:
            return [(ts, list(paths)) for ts, paths in self._saved]

    def statistics(self) -> SaverStatistics:
        """Counts and times of the saves so far (see :class:`SaverStatistics`)."""
        s = self._stats
        return SaverStatistics(
            saves=int(s["saves"]), written=int(s["written"]), capture_seconds=s["capture"],
            capture_seconds_max=s["capture_max"], wait_seconds=s["wait"],
            write_seconds=s["write"], bytes_written=int(s["bytes"]), host_bytes=int(s["host"]),
        )  # fmt: skip

    def add_listener(self, fn: Callable[[Timestamp, pathlib.Path], None]) -> None:
        """Call ``fn(timestamp, path)`` on the writer thread with each file complete on disk.

        It runs before pruning (the file still exists); the next save waits while it runs,
        so a listener may hold the writer back (e.g. :class:`CheckpointUploader` when its
        uploads in flight are at their bound). An exception from it is a write error.
        """
        with self._lock:
            self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[Timestamp, pathlib.Path], None]) -> None:
        """Stop calling ``fn`` (no error if it was not added)."""
        with self._lock:
            self._listeners = [f for f in self._listeners if f != fn]

    def wait_written(self, timeout: float | None = None) -> bool:
        """Block until the checkpoint being written (if any) is complete and handed over.

        Returns ``False`` if ``timeout`` seconds passed first.
        """
        with self._lock:
            return self._lock.wait_for(lambda: self._job is None, timeout)

    def request_save(self) -> None:
        """Save at the next checkpoint event, or at ``FIT_END`` if the run stops first.

        Safe from any thread and from a signal handler (it sets a flag). Preemption
        handling (``Trainer(preemption=...)``) calls it before asking training to stop,
        so the stopped run leaves a checkpoint of the last batch it trained on.
        """
        self._requested_captured.clear()
        self._save_requested = True

    def requested_save_captured(self) -> bool:
        """Whether the save :meth:`request_save` asked for has been captured (or none was)."""
        return self._requested_captured.is_set()

    def save_now(self, state: State, timeout: float) -> pathlib.Path | None:
        """Capture and write the requested checkpoint now, from the calling thread.

        For preemption's watchdog (``runtime/preemption.py``) when a stuck handler holds
        the training thread at a barrier, so that the requested save never comes: it does
        *not* wait for the handlers published so far (the stuck one never finishes), so
        callbacks' state is as their handlers left it. The training thread must be held
        (at a barrier) while this runs. Returns the file once written within ``timeout``
        seconds, else ``None`` (also when the requested save was captured already, and
        for a sharded checkpoint, whose collectives need every rank's training thread).
        """
        if self._requested_captured.is_set() or not self._save_requested or self._sharded:
            return None
        self._save_requested = False
        timestamp = state.timestamp
        path = self.path_for(timestamp)
        if not self.wait_written(timeout):
            return None
        if not any(p == [path] for _, p in self.saved_checkpoints):
            cap = capture(state, weights_only=self.weights_only, epoch_rng=epoch_rng(state),
                          pool=self._pool)  # fmt: skip
            self._stats["saves"] += 1
            self._submit(cap, timestamp, path)
        self._requested_captured.set()
        written = self.wait_written(timeout) and self._error is None
        if self._closed:  # after close() (a notice while the callbacks close): no writer left
            self._stop_writer()
        return path if written else None

    def path_for(self, timestamp: Timestamp) -> pathlib.Path:
        """The file a checkpoint at ``timestamp`` is written to (a folder for an FSDP model)."""
        if self._sharded:
            return self.folder / _dcp.folder_name(self.filename, timestamp)
        return self.folder / self.filename.format(**timestamp.state_dict(), rank=_rank())

    # -- handlers (training thread) ----------------------------------------------------------

    @blocking
    def fit_start(self, state: State, logger: Logger) -> None:
        """Delete temporary files that killed writes left in the folder (ours only); move
        the checkpoints later than where this fit starts aside (``checkpoint/abandoned.py``).
        """
        self._trained = False  # no batch of this fit() yet: a requested save has nothing
        self._closed = False
        if self.folder.is_dir() and _rank() == 0:
            remove_stale_partials(self.folder, time.time_ns(), self._subfolders)
            self._abandon_later(state.timestamp)

    def _abandon_later(self, start: Timestamp) -> None:
        """Move this folder's checkpoints named after ``start`` into ``abandoned/``."""
        names = (self.filename, _dcp.folder_name_template(self.filename))
        later = _abandoned.later_checkpoints(self.folder, names, start)
        if not later:
            return
        target = _abandoned.move_aside(self.folder, later, start)
        shown = ", ".join(repr(p.relative_to(self.folder).as_posix()) for p in later[:3])
        more = f" and {len(later) - 3} more" if len(later) > 3 else ""
        warnings.warn(
            f"CheckpointSaver: this run starts at batch {int(start.batch)} but "
            f"{str(self.folder)!r} holds {len(later)} checkpoint(s) of later batches ({shown}"
            f"{more}), the future of an abandoned attempt; moved to {str(target)!r} (nothing "
            "deleted), so this run saves its own",
            CheckpointWarning,
            stacklevel=2,
        )

    @blocking
    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        """Save if due (runs on the training thread: it captures, the writer writes)."""
        self._trained = True
        self._maybe_save(Event.BATCH_CHECKPOINT, state)

    @blocking
    def epoch_checkpoint(self, state: State, logger: Logger) -> None:
        """Save if due (runs on the training thread: it captures, the writer writes)."""
        self._maybe_save(Event.EPOCH_CHECKPOINT, state)

    @blocking
    def fit_end(self, state: State, logger: Logger) -> None:
        """Save if :meth:`request_save` asked and no checkpoint event has saved since.

        A ``fit()`` that trained no batch (a notice before its first one) has nothing new
        to save: the request is dropped, and the newest checkpoint stays the newest."""
        if self._save_requested and not self._trained:
            self._save_requested = False
            self._requested_captured.set()
        if self._save_requested:
            self._maybe_save(Event.FIT_END, state)

    def _is_due(self, event: Event, state: State) -> bool:
        if self._save_requested:
            return True
        if self._due_fn is not None:
            return bool(self._due_fn(state, event))
        assert self._interval is not None
        return self._interval.is_due(_INTERVAL_EVENT[event], state)

    def _maybe_save(self, event: Event, state: State) -> None:
        self._raise_write_error()
        if not self._is_due(event, state):
            return
        self._sharded = _dcp.is_sharded(state.model)
        timestamp = state.timestamp
        path = self.path_for(timestamp)
        requested = self._save_requested
        if requested:
            self._save_requested = False
            if any(p == [path] for _, p in self.saved_checkpoints) or (
                self._job is not None and self._job[2] == path
            ):
                self._requested_captured.set()
                return  # this very batch is saved already
        t0 = time.perf_counter()
        self._wait_idle()  # one save in flight: a due save waits for the previous write
        t1 = time.perf_counter()
        self._stats["wait"] += t1 - t0
        self._raise_write_error()
        if not self.overwrite and (_dcp.is_complete(path) if self._sharded else path.exists()):
            raise FileExistsError(
                f"CheckpointSaver: {str(path)!r} exists; pass overwrite=True to replace it, "
                "or another folder or filename"
            )
        if path.is_symlink():  # DCP would write through it: a checkpoint is ours alone
            raise FileExistsError(
                f"CheckpointSaver: {str(path)!r} is a symbolic link; a checkpoint is written "
                "only as a file or folder of the saver's own: remove the link"
            )
        if self._sharded and path.exists():
            # overwritten, or an interrupted save's (it had no .metadata)
            remove_checkpoint(path, rank=_rank())
        if not wait_for_handlers(state):  # every callback's state as of this event
            return  # the run is stopping: the next event unwinds it
        t2 = time.perf_counter()
        self._capturing = (timestamp, path)
        try:
            cap: Capture | _dcp.ShardedSave
            if self._sharded:  # every rank: DCP stages here and writes beside training
                if self._group is None:  # every rank, at its first save
                    self._group = _dcp.new_group()
                    if self._group is not None:  # a gloo group: a torch bug at exit
                        _gloo_exit.register()  # (runtime/gloo_exit.py)
                cap = _dcp.save(state, path, self.weights_only, epoch_rng(state), self._group)
            else:
                cap = capture(state, weights_only=self.weights_only, epoch_rng=epoch_rng(state),
                              pool=self._pool)  # fmt: skip
        finally:
            self._capturing = None
        elapsed = time.perf_counter() - t2
        s = self._stats
        s["saves"] += 1
        s["capture"] += elapsed
        s["capture_max"] = max(s["capture_max"], elapsed)
        s["host"] = cap.host_bytes
        self._submit(cap, timestamp, path)
        if requested:
            self._requested_captured.set()

    def _raise_write_error(self) -> None:
        if self._error is None:  # the common case, read without the lock (every batch)
            return
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise error

    # -- the writer thread -------------------------------------------------------------------

    def _wait_idle(self) -> None:
        with self._lock:
            while self._job is not None:
                self._lock.wait()

    def _submit(
        self, cap: Capture | _dcp.ShardedSave, timestamp: Timestamp, path: pathlib.Path
    ) -> None:
        with self._lock:
            if self._thread is None:
                self._closing = False
                thread = threading.Thread(
                    target=self._work, name="trainbus-checkpoint-writer", daemon=True
                )  # refused: a ThreadStartError from this checkpoint event, nothing queued
                self._thread = start_thread(thread, needed=_WRITER_ROLE)
            self._job = (cap, timestamp, path)
            self._lock.notify_all()

    def _work(self) -> None:
        while True:
            with self._lock:
                while self._job is None and not self._closing:
                    self._lock.wait()
                if self._job is None:
                    return
                cap, timestamp, path = self._job
            t0, started_ns = time.perf_counter(), time.time_ns()
            error: BaseException | None = None
            try:
                size = cap.write(path)
                for listener in list(self._listeners):
                    listener(timestamp, path)
            except BaseException as exc:
                exc.add_note(f"while CheckpointSaver wrote {str(path)!r}")
                error = exc
            buffers = cap.buffers
            del cap  # the payload is written: its buffers are free for the next capture
            with self._lock:
                self._pool = buffers
                self._stats["write"] += time.perf_counter() - t0
                if error is None:
                    self._stats["written"] += 1
                    self._stats["bytes"] += size
                    self._saved = [e for e in self._saved if e[1] != [path]]
                    self._saved.append((timestamp, [path]))
                    self._prune()
                    # none is this saver's now
                    remove_stale_partials(self.folder, started_ns, self._subfolders)
                elif self._error is None:
                    self._error = error
                self._job = None
                self._lock.notify_all()

    def _stop_writer(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            self._closing = True
            self._lock.notify_all()
        if thread is not None:
            thread.join()

    def _prune(self) -> None:
        keep = self.num_checkpoints_to_keep
        while keep > 0 and len(self._saved) > keep:
            _, paths = self._saved.pop(0)
            for p in paths:
                # a file, or (rank zero) a sharded checkpoint's folder; never a link
                remove_checkpoint(p, rank=_rank())

    def close(self, state: State, logger: Logger) -> None:
        """Wait for the write in flight, stop the writer; raise a write error not yet raised."""
        self._closed = True
        self._stop_writer()
        group, self._group = self._group, None  # DCP's group: every write on it is done
        _dcp.destroy_group(group)
        self._pool = {}  # give the host buffers back between fit() cycles
        self._raise_write_error()

    # -- Serializable ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The checkpoints written so far (and the one being captured), for pruning on resume.

        Paths are kept relative to ``folder``, so a moved folder still resumes its list.
        """
        entries = [(ts, paths[0]) for ts, paths in self.saved_checkpoints]
        if self._capturing is not None:
            entries.append(self._capturing)
        return {
            "saved": [[ts.state_dict(), p.relative_to(self.folder).as_posix()] for ts, p in entries]
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the list of written checkpoints that are still in this saver's folder."""
        saved = []
        for ts, rel in state.get("saved", []):
            path = self.folder / rel
            if path.is_file() or _dcp.is_complete(path):
                saved.append((Timestamp(**ts), [path]))
        with self._lock:
            self._saved = saved
