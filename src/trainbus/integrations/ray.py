"""trainbus inside Ray Train workers (``trainbus[ray]``): reports, checkpoints, restarts.

A :class:`trainbus.Trainer` built inside the function given to Ray Train's
``TorchTrainer(train_loop_per_worker=...)`` trains unchanged: Ray creates the process group
before the function runs, and the Trainer joins it (ranks, world size; the local rank and
the device from Ray, through the :class:`~trainbus.runtime.distributed.Launcher` this module
registers when it is imported), wraps the model in DDP and shards the data as under
``torchrun``.

- :class:`RayReporter`, a logger destination on **every** rank, calls ``ray.train.report``
  at the same events on every rank (the saver's save events, and ``FIT_END``), with the
  metrics logged so far and, on rank zero, the :class:`~trainbus.callbacks.CheckpointSaver`'s
  checkpoint of that batch as a ``ray.train.Checkpoint``. The calls run on the reporter's
  own thread, never on the training thread (``ray.train.report`` is a barrier across the
  ranks and uploads the checkpoint).
- Ray's drain notice (a node of the worker group will be preempted: what
  ``ray.train.get_preemption_info()`` returns) becomes trainbus's preemption notice: the
  reporter announces it (:meth:`RayReporter.pending_preemption`), the training loop gives
  it at the next batch boundary with the drain's deadline, and every rank stops one batch
  later with a checkpoint, which the reporter hands to Ray before the deadline.
- :func:`checkpoint_path` is the folder of the checkpoint Ray restarts the worker group
  from (``ray.train.get_checkpoint()``), for ``Trainer(load_path=...)``.
- :func:`fit_sync` is ``trainer.fit_sync()`` for a Ray Train worker: after a drain stopped
  the run, it waits for Ray to take the worker down, so that Ray restarts the group from
  that checkpoint as a preemption.

``docs/distributed.md`` ("Ray Train") is the user's guide.

Example:
    >>> def train_loop(config):
    ...     saver = CheckpointSaver("/tmp/ckpt", save_interval="1ep")
    ...     trainer = Trainer(model, loader, "4ep", callbacks=[saver],
    ...                       loggers=[RayReporter()], load_path=checkpoint_path())
    ...     trainer.fit_sync()
    >>> TorchTrainer(train_loop, scaling_config=ScalingConfig(num_workers=2)).fit()
"""

from __future__ import annotations

import os
import pathlib
import queue
import shutil
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any

import ray.train
import torch

from trainbus.callbacks._interval import Interval
from trainbus.callbacks.checkpoint_saver import CheckpointSaver
from trainbus.core.callback import blocking
from trainbus.core.destination import LoggerDestination
from trainbus.core.events import Event
from trainbus.core.threads import start_thread
from trainbus.core.time import Time
from trainbus.runtime.distributed import register_launcher
from trainbus.runtime.preemption import TrainingPreempted

if TYPE_CHECKING:
    from trainbus.core.logger import Logger
    from trainbus.core.state import State
    from trainbus.core.timer import Timestamp
    from trainbus.training.trainer import Trainer

__all__ = ["RayReporter", "checkpoint_path", "drain_notice", "fit_sync"]

_INTERVAL_EVENT = {Event.BATCH_CHECKPOINT: Event.BATCH_END, Event.EPOCH_CHECKPOINT: Event.EPOCH_END}
_NOT_A_WORKER = (
    "{what} talks to Ray Train, but this process is not a Ray Train worker; build the "
    "Trainer inside the function you give TorchTrainer(train_loop_per_worker=...)"
)


def _in_ray_worker() -> bool:
    try:
        ray.train.get_context()
    except RuntimeError:
        return False
    return True


class _RayTrain:
    """The :class:`~trainbus.runtime.distributed.Launcher` of Ray Train's workers."""

    name = "ray"

    def started_here(self) -> bool:
        return _in_ray_worker()

    def local_rank(self) -> int:
        return int(ray.train.get_context().get_local_rank())

    def device(self, device: torch.device) -> torch.device:
        if device.type != "cuda" or device.index is not None:
            return device
        from ray.train.torch import get_device

        chosen = get_device()  # the GPU Ray assigned to this worker
        return chosen if chosen.type == "cuda" else device


register_launcher(_RayTrain())


def checkpoint_path(download_to: str | os.PathLike[str] | None = None) -> pathlib.Path | None:
    """The folder of the checkpoint to resume from, or ``None`` on a first start.

    Call it in the training function and pass the result as ``Trainer(load_path=...)``:
    after ``FailureConfig(max_failures=...)`` restarted the worker group (or a new run
    was started with ``TorchTrainer(resume_from_checkpoint=...)``), it is the last
    checkpoint a :class:`RayReporter` handed to Ray (``ray.train.get_checkpoint()``), and
    the run resumes from it exactly as from any ``load_path``. A checkpoint on local
    storage is read where it is; one on remote storage (``s3://...``) is downloaded first,
    to ``download_to`` (default: a new temporary folder).

    Raises:
        RuntimeError: Not called inside a Ray Train worker.
    """
    if not _in_ray_worker():
        raise RuntimeError(_NOT_A_WORKER.format(what="checkpoint_path()"))
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return None
    import pyarrow.fs

    if isinstance(checkpoint.filesystem, pyarrow.fs.LocalFileSystem):
        return pathlib.Path(checkpoint.path)
    target = download_to if download_to is not None else tempfile.mkdtemp(prefix="trainbus-ray-")
    return pathlib.Path(checkpoint.to_directory(target))


# -- Ray's drain notice ------------------------------------------------------------------------
#
# Ray Train's PreemptionWatcher (an actor of the run) polls Ray's drain state (GCS) and, when
# a node of the worker group is being drained, calls `mark_preempt(info)` on every worker
# actor, which stores the `ray.train.PreemptionInfo` in the worker's PreemptionContext. The
# public `ray.train.get_preemption_info()` returns rank zero's copy of it, but it is a
# collective (every worker must call it the same number of times), too dear for every batch.
# The reporter reads this worker's own copy instead: one attribute read, no call into Ray;
# the ranks that read it at different batches still stop at one batch, through the stop
# agreement.


def _preemption_context() -> Any:
    """This Ray Train worker's PreemptionContext (``.preemption_info``), or ``None``."""
    try:
        from ray.train.v2._internal.execution.context import get_train_context
    except ImportError:  # a Ray Train without v2's context
        return None
    try:
        return getattr(get_train_context(), "preemption_context", None)
    except RuntimeError:  # v2 is installed but the run is Ray Train v1's
        return None


def drain_notice(info: ray.train.PreemptionInfo) -> tuple[str, float | None]:
    """The trainbus notice for Ray's drain ``info``: ``(reason, deadline)``.

    ``reason`` names the drain (``"Ray drains node 1a2b3c4d (preempted ranks [0, 1])"``);
    ``deadline`` is the drain's ``deadline_ms`` (Unix time in milliseconds, when the node
    is taken) as a :func:`time.monotonic` value, ``time.monotonic() + (t - time.time())``
    for ``t = deadline_ms / 1000``, or ``None`` when Ray reported no deadline (the
    preemption's grace period then applies).

    Example:
        >>> info = ray.train.PreemptionInfo(deadline_ms=int(time.time() * 1000) + 30_000,
        ...                                 preempted_node_to_ranks={"1a2b3c4d5e": [0, 1]})
        >>> reason, deadline = drain_notice(info)   # deadline - time.monotonic(): ~30.0
        >>> reason
        'Ray drains node 1a2b3c4d (preempted ranks [0, 1])'
    """
    nodes = ", ".join(node[:8] for node in info.preempted_node_ids)
    reason = f"Ray drains node {nodes} (preempted ranks {info.preempted_ranks})"
    if info.deadline_ms is None:
        return reason, None
    return reason, time.monotonic() + (info.deadline_ms / 1000 - time.time())


def fit_sync(trainer: Trainer, *, duration: Time[Any] | str | int | None = None) -> None:
    """``trainer.fit_sync()`` in a Ray Train worker, waiting out Ray's drain after a stop.

    When a drain notice stopped the run (its checkpoint handed to Ray by the
    :class:`RayReporter`), Ray restarts the worker group from that checkpoint once the
    drain's deadline has passed (``FailureConfig(max_preemption_failures=...)``, not
    ``max_failures``), but only while the workers are still running: a training function
    that returns ends Ray's run as finished, one that raises fails it. So after such a stop
    this waits for Ray to take the worker down (the deadline plus
    ``FailureConfig(preemption_grace_s=...)``); if Ray has not done so a minute after that,
    it raises the :class:`~trainbus.TrainingPreempted` it holds. Any other outcome is
    ``trainer.fit_sync()``'s.

    Raises:
        TrainingPreempted: A preemption stopped the run and Ray is not draining the worker
            group (a ``SIGTERM``, ``trainer.preempt()``), or Ray did not end the worker.

    Example:
        >>> def train_loop(config):
        ...     trainer = Trainer(model, loader, "4ep", callbacks=[CheckpointSaver("ckpt")],
        ...                       loggers=[RayReporter()], load_path=checkpoint_path())
        ...     fit_sync(trainer)
    """
    try:
        trainer.fit_sync(duration=duration)
    except TrainingPreempted:
        context = _preemption_context()
        info = None if context is None else context.preemption_info
        if info is None:
            raise
        _wait_for_ray(info)
        raise


#: Seconds past the drain's deadline (and Ray's preemption_grace_s) that fit_sync waits.
_TEARDOWN_MARGIN = 60.0
#: Ray's wait for a drain without a deadline (ray.train.v2's DEFAULT_PREEMPTION_DEADLINE_S).
_NO_DEADLINE_WAIT = 120.0


def _wait_for_ray(info: ray.train.PreemptionInfo) -> None:
    """Sleep until Ray's controller restarts the worker group (it ends this process)."""
    try:
        from ray.train.v2._internal.execution.context import get_train_context

        failure_config = get_train_context().train_run_context.run_config.failure_config
        grace = float(getattr(failure_config, "preemption_grace_s", 0.0))
    except (ImportError, AttributeError, RuntimeError):
        grace = 0.0
    if info.deadline_ms is None:
        until = time.monotonic() + _NO_DEADLINE_WAIT
    else:
        until = time.monotonic() + (info.deadline_ms / 1000 - time.time())
    until += grace + _TEARDOWN_MARGIN
    while (left := until - time.monotonic()) > 0:
        time.sleep(min(left, 5.0))


def _plain(value: Any) -> Any:
    """A metric value Ray can pickle (no tensors), or ``None`` to leave it out."""
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)  # the same file system: no copy
    except OSError:
        shutil.copy2(source, target)


def _stage(path: pathlib.Path, folder: pathlib.Path) -> None:
    """Put the checkpoint ``path`` (a file, or a sharded checkpoint's folder) in ``folder``."""
    if path.is_dir():
        shutil.copytree(path, folder / path.name, copy_function=_link_or_copy)
    else:
        folder.mkdir(parents=True, exist_ok=True)
        _link_or_copy(str(path), str(folder / path.name))


class RayReporter(LoggerDestination):
    """Reports a trainbus run to Ray Train: metrics and checkpoints, on every rank alike.

    ``ray.train.report`` must be called by every worker the same number of times (it is a
    barrier across them), and Ray keeps rank zero's metrics with each checkpoint. This
    destination runs on every rank (it refuses to be rank-zero-only) and reports at the
    same events everywhere: each event the saver's ``save_interval`` (or ``interval``)
    falls on, and ``FIT_END`` unless that batch was just reported. Each report carries
    the latest value of every metric logged on this rank (Ray keeps rank zero's) plus
    ``epoch`` and ``batch``; on rank zero it carries the checkpoint the
    :class:`~trainbus.callbacks.CheckpointSaver` wrote of that batch, as a
    ``ray.train.Checkpoint`` folder that Ray copies to its storage path, so
    ``CheckpointConfig(num_to_keep=...)``, ``result.checkpoint`` and Ray Tune see it like
    a native run's.

    Ray's drain notice (``drain_notice=True``, the default): when Ray announces that a
    node of the worker group will be drained, the run stops as on ``trainer.preempt()``,
    with the drain's deadline and ``state.preemption.reason`` naming it
    (:func:`drain_notice`). The training loop asks :meth:`pending_preemption` at each batch
    boundary on the training thread (one attribute read of this worker's copy of Ray's
    ``PreemptionInfo``; no call into Ray); the notice is given at the first boundary after
    Ray marked this worker, every rank stops one batch later (the stop agreement), the
    saver checkpoints that batch at ``FIT_END`` and the reporter hands it to Ray there,
    before the deadline. Use :func:`fit_sync` so that Ray then restarts the group from it.

    What waits for what: at a report event its handler, on its lane (not the training
    thread), copies the metrics and queues the report (at other batches it only checks
    the interval). The reporter's thread makes the call: it waits for the saver to finish
    writing that checkpoint (a hard link of the file is handed to Ray, so pruning by
    ``num_checkpoints_to_keep`` does not race the upload), then calls
    ``ray.train.report``, which waits for every rank's matching report and uploads. The
    handler waits only when two reports are still outstanding (the bound; the next
    ``BATCH_END`` barrier then waits for it), and ``close`` returns when this rank's
    reports have all returned.

    Args:
        saver: The saver whose checkpoints are reported; default: the run's one
            ``CheckpointSaver`` (none: metrics only).
        interval: When to report; default: the saver's ``save_interval`` (``"1ep"``
            without a saver). A saver saving on a function needs ``interval=``.
        close_timeout: Seconds ``close`` waits for the outstanding reports (a peer that
            never reports, having stopped at another batch) before it raises.
        drain_notice: Whether Ray's drain notice stops the run (above); ``False``: the
            run trains on through a drain until Ray ends it (Ray restarts the group from
            the last checkpoint reported before).

    Raises:
        ValueError: ``rank_zero_only`` is set (on the class or the instance): the other
            ranks would never report and rank zero's report would wait for them forever.

    Example:
        >>> trainer = Trainer(model, loader, "4ep", callbacks=[CheckpointSaver("ckpt")],
        ...                   loggers=[RayReporter()], load_path=checkpoint_path())
    """

    def __init__(
        self,
        saver: CheckpointSaver | None = None,
        *,
        interval: Time[Any] | str | int | None = None,
        close_timeout: float = 120.0,
        drain_notice: bool = True,
    ) -> None:
        if getattr(type(self), "rank_zero_only", False) is True:
            raise ValueError(self._rank_zero_message())
        if saver is not None and not isinstance(saver, CheckpointSaver):
            raise TypeError(
                f"saver={saver!r} must be a trainbus.callbacks.CheckpointSaver (or None: the "
                "run's one saver)"
            )
        if isinstance(close_timeout, bool) or not isinstance(close_timeout, int | float) or not (
            close_timeout > 0
        ):
            raise ValueError(f"close_timeout={close_timeout!r} must be seconds > 0, e.g. 120.0")
        self.saver = saver
        self._interval: Interval | None = (
            None if interval is None else Interval(interval, name="interval")
        )
        self.close_timeout = float(close_timeout)
        if not isinstance(drain_notice, bool):
            raise TypeError(f"drain_notice={drain_notice!r} must be True or False")
        self.drain_notice = drain_notice
        self._preemption: Any = None  # Ray's PreemptionContext of this worker (fit_start)
        self._latest: dict[str, Any] = {}  # the lane's (log_metrics), read at report events
        self._last_batch: int | None = None  # the batch of the last report (the lane's)
        self._reports: queue.SimpleQueue[tuple[dict[str, Any], int] | None] = queue.SimpleQueue()
        self._outstanding = threading.BoundedSemaphore(2)  # queued or being made
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._staged: dict[int, pathlib.Path] = {}  # batch -> the folder handed to Ray
        self._stage_root: pathlib.Path | None = None
        self._error: BaseException | None = None
        self._attach = False  # whether this rank hands checkpoints (rank zero's saver)
        self.reported = 0  #: ``ray.train.report`` calls that returned, this rank

    # -- rank_zero_only is refused -----------------------------------------------------------

    @property
    def rank_zero_only(self) -> bool:
        """Always ``False``: every rank must report (setting it ``True`` raises)."""
        return False

    @rank_zero_only.setter
    def rank_zero_only(self, value: bool) -> None:
        if value:
            raise ValueError(self._rank_zero_message())

    @staticmethod
    def _rank_zero_message() -> str:
        return (
            "RayReporter cannot be rank_zero_only: ray.train.report is a barrier that every "
            "rank must reach the same number of times, so a report from rank zero alone "
            "would wait for the other ranks forever; leave it on every rank (Ray keeps rank "
            "zero's metrics and checkpoint) and mark your own callbacks rank-zero-only instead"
        )

    # -- setup -------------------------------------------------------------------------------

    def _find_saver(self, state: State) -> CheckpointSaver | None:
        if self.saver is not None:
            return self.saver
        savers = [cb for cb in state.callbacks if isinstance(cb, CheckpointSaver)]
        if len(savers) > 1:
            raise ValueError(
                f"RayReporter: the run has {len(savers)} CheckpointSavers; pass the one whose "
                "checkpoints Ray should keep: RayReporter(saver=...)"
            )
        return savers[0] if savers else None

    def _schedule(self, saver: CheckpointSaver | None) -> Interval:
        if self._interval is not None:
            return self._interval
        if saver is None:
            return Interval("1ep")
        interval = saver._interval
        if interval is None:
            raise ValueError(
                "RayReporter: the saver's save_interval is a function, which cannot be asked "
                "on every rank alike; pass RayReporter(interval=...), e.g. interval='1ep'"
            )
        return interval

    @blocking
    def fit_start(self, state: State, logger: Logger) -> None:
        """Check the setup and start the reporter's thread (training thread, once a fit)."""
        if not _in_ray_worker():
            raise RuntimeError(_NOT_A_WORKER.format(what="RayReporter"))
        saver = self._find_saver(state)
        self.saver = saver
        self._interval = self._schedule(saver)
        if saver is not None:
            if saver not in state.callbacks:
                raise ValueError(
                    "RayReporter(saver=...) is not one of the run's callbacks; pass it in "
                    "callbacks=[...] too"
                )
            if state.callbacks.index(saver) > state.callbacks.index(self):
                raise ValueError(
                    "RayReporter must come after its CheckpointSaver (it reports the "
                    "checkpoint the saver captured at the same event): pass the saver in "
                    "callbacks=[...] and the reporter in loggers=[...]"
                )
        # Rank zero's saver hands its checkpoints (with an FSDP model every rank saves the
        # shards of one folder; rank zero hands the folder).
        self._attach = saver is not None and state.rank == 0
        self._error = None
        self._preemption = None
        if self.drain_notice:
            self._preemption = _preemption_context()
            if self._preemption is None:
                raise RuntimeError(
                    "RayReporter(drain_notice=True) reads Ray Train v2's preemption info "
                    "(ray.train.get_preemption_info, Ray >= 2.60 with Ray Train v2), which "
                    "this worker does not have; pass RayReporter(drain_notice=False)"
                )
        if self._attach and saver is not None:
            saver.remove_listener(self._on_written)
            saver.add_listener(self._on_written)
            self._stage_root = pathlib.Path(
                tempfile.mkdtemp(prefix=".trainbus-ray-", dir=saver.folder.parent)
                if saver.folder.parent.is_dir()
                else tempfile.mkdtemp(prefix="trainbus-ray-")
            )
        thread = threading.Thread(target=self._work, name="trainbus-ray-reporter", daemon=True)
        self._thread = start_thread(thread, needed="It makes RayReporter's ray.train.report calls")

    # -- Ray's drain notice (the training thread, each batch boundary) -----------------------

    def pending_preemption(self) -> tuple[str, float | None] | None:
        """Ray's drain notice for this worker, as ``(reason, deadline)``, or ``None``.

        Asked by the training loop at each batch boundary on the training thread while the
        run has no notice (:class:`~trainbus.runtime.preemption.AnnouncesPreemption`): one
        attribute read of the ``ray.train.PreemptionInfo`` Ray's watcher gave this worker;
        :func:`drain_notice` converts it once it is there.
        """
        context = self._preemption
        if context is None:
            return None
        info = context.preemption_info
        if info is None:
            return None
        return drain_notice(info)

    # -- what was logged (this destination's lane) -------------------------------------------

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        """Keep the latest value of each metric for the next report."""
        for name, value in metrics.items():
            plain = _plain(value)
            if plain is not None:
                self._latest[name] = plain

    # -- report events (this destination's lane) ---------------------------------------------
    #
    # Plain handlers: each runs on the reporter's lane after the records logged before its
    # event, and after the saver's @blocking handler of the same event captured (the saver
    # comes first: a callback, the reporter a logger). A @blocking handler here would make
    # the training thread wait for the lane's records at every batch.

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        """Queue a report if the interval falls on this batch."""
        interval = self._interval
        if interval is not None and interval.is_due(Event.BATCH_END, state):
            self._queue(state.timestamp)

    def epoch_checkpoint(self, state: State, logger: Logger) -> None:
        """Queue a report if the interval falls on this epoch."""
        interval = self._interval
        if interval is not None and interval.is_due(Event.EPOCH_END, state):
            self._queue(state.timestamp)

    def fit_end(self, state: State, logger: Logger) -> None:
        """Queue the last report, unless this batch was just reported."""
        if self._last_batch != int(state.timestamp.batch):
            self._queue(state.timestamp)

    def _queue(self, timestamp: Timestamp) -> None:
        self._raise_error()
        batch = int(timestamp.batch)
        self._last_batch = batch
        metrics = dict(self._latest)
        metrics["epoch"], metrics["batch"] = int(timestamp.epoch), batch
        self._outstanding.acquire()  # waits while two reports are outstanding
        self._reports.put((metrics, batch))

    def _raise_error(self) -> None:
        error = self._error
        if error is not None:
            self._error = None
            raise error

    # -- the saver's writer thread -----------------------------------------------------------

    def _on_written(self, timestamp: Timestamp, path: pathlib.Path) -> None:
        """Link each checkpoint the saver completes into a folder of its own, for Ray."""
        root = self._stage_root
        if root is None:
            return
        folder = root / f"ba{int(timestamp.batch)}"
        if folder.exists():
            shutil.rmtree(folder)
        _stage(path, folder)
        with self._lock:
            self._staged[int(timestamp.batch)] = folder

    # -- the reporter's thread ---------------------------------------------------------------

    def _work(self) -> None:
        while True:
            item = self._reports.get()
            if item is None:
                return
            metrics, batch = item
            folder = None
            try:
                if self._error is not None:
                    continue  # failed: the training thread raises it at its next report
                if self._attach and self.saver is not None:
                    self.saver.wait_written()  # the checkpoint of `batch`, if it saved one
                    folder = self._take_staged(batch)
                self._report(metrics, folder)
                self.reported += 1
            except BaseException as exc:
                exc.add_note(f"while RayReporter reported batch {batch} to Ray Train")
                self._error = exc
            finally:
                if folder is not None:
                    shutil.rmtree(folder, ignore_errors=True)
                self._outstanding.release()

    def _take_staged(self, batch: int) -> pathlib.Path | None:
        """The folder staged for ``batch``; folders of earlier, unreported batches go."""
        with self._lock:
            folder = self._staged.pop(batch, None)
            stale = [b for b in self._staged if b < batch]
            old = [self._staged.pop(b) for b in stale]
        for path in old:
            shutil.rmtree(path, ignore_errors=True)
        return folder

    def _report(self, metrics: dict[str, Any], folder: pathlib.Path | None) -> None:
        """The one call into Ray: a barrier across the ranks, then the upload (if any)."""
        checkpoint = None if folder is None else ray.train.Checkpoint.from_directory(folder)
        ray.train.report(metrics, checkpoint=checkpoint)

    # -- close -------------------------------------------------------------------------------

    def close(self, state: State, logger: Logger) -> None:
        """Wait for this rank's outstanding reports; raise a report's error."""
        thread, self._thread = self._thread, None
        try:
            if thread is not None:
                self._reports.put(None)
                thread.join(self.close_timeout)
                if thread.is_alive():
                    raise RuntimeError(
                        f"RayReporter: ray.train.report did not return within "
                        f"close_timeout={self.close_timeout:g}s on rank {state.rank}: another "
                        "rank did not make the same report (did it stop at another batch, or "
                        "fail?). The reporter's thread is left behind"
                    )
        finally:
            self._preemption = None
            if self.saver is not None:
                self.saver.remove_listener(self._on_written)
            root, self._stage_root = self._stage_root, None
            if root is not None and (thread is None or not thread.is_alive()):
                shutil.rmtree(root, ignore_errors=True)
            with self._lock:
                self._staged.clear()
        self._raise_error()
