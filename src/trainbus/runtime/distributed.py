"""Training on several processes with ``torch.distributed`` (``torchrun``, Ray Train, ...).

The Trainer calls into this module at a few points and nowhere else:

- :func:`setup` (constructor): under ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``MASTER_ADDR`` and ``MASTER_PORT`` in the environment, ``WORLD_SIZE`` > 1) it initialises
  the default process group when the user has not (``gloo`` on the CPU,
  ``cpu:gloo,cuda:nccl`` on CUDA, with a timeout), and picks ``cuda:LOCAL_RANK`` for a
  CUDA device given without an index; under a launcher that creates the group itself before
  the user's code runs (Ray Train: a :class:`Launcher` that ``trainbus.integrations.ray``
  registers with :func:`register_launcher`) it joins that group and asks the launcher for
  the local rank and the device; with a gloo group it registers the exit handler of
  :mod:`trainbus.runtime.gloo_exit` (a torch bug could otherwise abort the process as it exits);
- :func:`unwrap` and :func:`wrap_model`: the user's module stays ``state.model``; the
  ``DistributedDataParallel`` wrapper the loop trains through is ``state.ddp_model``
  (a model already wrapped in DDP is unwrapped and kept; an FSDP model is left as it is,
  and its ``CheckpointSaver`` runs on every rank, saving with ``torch.distributed.checkpoint``);
- :func:`shard_loader`: a ``DataLoader`` with a plain sampler is rebuilt with the same
  arguments and a ``DistributedSampler`` (the loop's resume hook calls its ``set_epoch``);
- :func:`runs_here`: rank-zero-only callbacks are not registered with the engine on other
  ranks (so no barrier waits for them and no collective is involved);
- :func:`reduce_eval` (loop, training thread): evaluation sums and counts are summed
  across ranks with one ``all_reduce``;
- :func:`abort_on_failure` (``fit()``, training thread): a rank whose training raises
  aborts an NCCL process group, so its peers' pending collectives fail at once (with
  gloo they fail when the failing process exits, or after the timeout);
- :class:`StopAgreement` (each ``fit()``'s training thread, from its start to its end): a stop asked
  on any one rank (a stopper, a preemption notice, a failed handler) ends every rank after
  the same batch. Each boundary starts a non-blocking ``all_reduce`` (MAX) of this rank's
  flags on a gloo group of its own and waits for the one started at the boundary before,
  long finished by then: every rank stops one batch after the first asked, together;
- :class:`~trainbus.runtime.peer_notices.PeerNotices` (each ``fit()``, beside the
  agreement): a preemption notice reaches every rank at once through the process group's
  key-value store, not at a batch boundary, so that a rank whose training thread cannot
  reach one (it waits at a barrier for a stuck handler, or in a collective for such a
  peer) still gets it and bounds its stop;
- :func:`sigterm_stops` (``fit()``, main thread): ``torchrun`` sends ``SIGTERM`` to every
  other worker once one has failed; during a distributed ``fit()`` that signal stops
  training at the next batch and lets every callback close before ``fit()`` raises
  (instead of killing the process mid-close).

``docs/distributed.md`` is the user's guide.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import os
import signal
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch
import torch.distributed as dist

from trainbus.checkpoint.sharded import is_sharded
from trainbus.core.exceptions import TrainbusWarning
from trainbus.runtime import gloo_exit as _gloo_exit

if TYPE_CHECKING:
    from trainbus.core.state import State

__all__ = [
    "DEFAULT_DIST_TIMEOUT",
    "DistInfo",
    "Launcher",
    "StopAgreement",
    "abort_on_failure",
    "check_checkpointing",
    "is_sharded",
    "launched_by_torchrun",
    "rank_zero_only",
    "reduce_eval",
    "register_launcher",
    "runs_here",
    "setup",
    "shard_loader",
    "sigterm_stops",
    "sync_gradients",
    "unwrap",
    "wrap_model",
]

#: Seconds a collective may wait for its peers before it fails (Composer's ``dist_timeout``).
DEFAULT_DIST_TIMEOUT = 300.0

_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_RANK_ZERO_ATTR = "rank_zero_only"
#: A rank-zero-only callback that writes its shard of each checkpoint on every rank when the
#: model is FSDP-sharded sets this class attribute true (``CheckpointSaver``): the runtime
#: asks for the declaration, not for the class of a layer above it.
WRITES_SHARDS_ATTR = "writes_shards_when_sharded"
#: A callback that uploads single checkpoint files sets this class attribute true
#: (``CheckpointUploader``): an FSDP model's checkpoints are folders it cannot upload.
UPLOADS_FILES_ATTR = "uploads_checkpoint_files"

C = TypeVar("C", bound=type)


def rank_zero_only(cls: C) -> C:
    """Class decorator: instances of ``cls`` act on rank zero only.

    Sets the class attribute ``rank_zero_only = True``. On other ranks the Trainer does not
    register such a callback with its engine at all: none of its handlers, ``close``
    included, runs there, no barrier waits for it, and no collective is involved (a
    rank-zero-only handler can never make other ranks wait). In a single process every
    callback runs. An instance may override its class: ``cb.rank_zero_only = False``.

    Example:
        >>> @trainbus.rank_zero_only
        ... class Upload(trainbus.Callback):
        ...     async def batch_end(self, state, logger): ...

    Raises:
        TypeError: ``cls`` is not a :class:`~trainbus.Callback` subclass.
    """
    from trainbus.core.callback import Callback

    if not (isinstance(cls, type) and issubclass(cls, Callback)):
        raise TypeError(
            f"@rank_zero_only decorates Callback subclasses, got {cls!r}; for one instance "
            "set its attribute instead: callback.rank_zero_only = True"
        )
    setattr(cls, _RANK_ZERO_ATTR, True)
    return cls


@dataclass(frozen=True, slots=True)
class DistInfo:
    """This process's place in the job.

    Attributes:
        rank: The global rank (0 .. world_size - 1).
        world_size: The number of processes.
        local_rank: The rank on this machine (``LOCAL_RANK``; the CUDA device index).
        launcher: The :attr:`Launcher.name` that started the process group
            (``"torchrun"``, ``"ray"``), or ``""`` (one process, or a group the user
            initialised).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launcher: str = ""

    @property
    def distributed(self) -> bool:
        """Whether more than one process trains."""
        return self.world_size > 1


class Launcher(Protocol):
    """What started this process and its process group, when it is not ``torchrun``.

    A cluster engine that creates the default process group before the user's training
    function runs (Ray Train's ``TorchTrainer`` does) registers one with
    :func:`register_launcher`; the Trainer's :func:`setup` then takes this rank's place on
    the machine and its device from it, and ranks and world size from the group. The
    Trainer never imports the engine: ``trainbus.integrations.ray`` registers its launcher
    when it is imported.

    Attributes:
        name: A short name for :attr:`DistInfo.launcher` and messages, e.g. ``"ray"``.
    """

    name: str

    def started_here(self) -> bool:
        """Whether this process is one of the launcher's workers (cheap; asked once)."""
        ...

    def local_rank(self) -> int:
        """This process's rank on its machine."""
        ...

    def device(self, device: torch.device) -> torch.device:
        """The device to train on for the user's ``device`` (CUDA without an index: this
        worker's GPU); a CPU device comes back unchanged."""
        ...


_LAUNCHERS: list[Launcher] = []


def register_launcher(launcher: Launcher) -> None:
    """Make ``launcher`` known to :func:`setup` (once per launcher; later calls are no-ops).

    Launchers are asked before ``torchrun``'s environment, the last registered first.
    """
    if not any(known is launcher for known in _LAUNCHERS):
        _LAUNCHERS.insert(0, launcher)


def _launcher() -> Launcher | None:
    return next((known for known in _LAUNCHERS if known.started_here()), None)


def launched_by_torchrun() -> bool:
    """Whether the environment holds torchrun's ``env://`` rendezvous variables."""
    return all(os.environ.get(name) for name in _TORCHRUN_ENV)


def _env_int(name: str) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"environment variable {name}={value!r} must be an int; launch with torchrun, "
            "which sets RANK, WORLD_SIZE and LOCAL_RANK"
        ) from None


def _check_timeout(timeout: float) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError(
            f"dist_timeout={timeout!r} must be a positive number of seconds, e.g. 300.0"
        )
    return float(timeout)


def setup(device: torch.device, timeout: float) -> tuple[DistInfo, torch.device]:
    """Join (or initialise) the default process group; this rank's info and device.

    Returns ``DistInfo()`` (rank 0 of 1) and ``device`` unchanged outside ``torchrun``
    when the user has not initialised a process group either. A registered
    :class:`Launcher` that started this process (Ray Train) is asked for the local rank
    and the device; ranks and world size always come from the group.
    """
    seconds = _check_timeout(timeout)
    if not dist.is_available():
        return DistInfo(), device
    launcher = _launcher()
    name = launcher.name if launcher is not None else ""
    if launcher is None and launched_by_torchrun():
        name = "torchrun"
    if not dist.is_initialized():
        # A registered launcher creates its group before the user's code: without one,
        # its worker trains alone (Ray Train with num_workers=1 creates none).
        if launcher is not None:
            return DistInfo(launcher=name), launcher.device(device)
        if name != "torchrun" or _env_int("WORLD_SIZE") < 2:
            return DistInfo(), device
        local = _env_int("LOCAL_RANK")
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", local)
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=seconds))
    if "gloo" in str(dist.get_backend()):  # avoids a torch bug at exit (trainbus.runtime.gloo_exit)
        _gloo_exit.register()
    if launcher is not None:
        local_rank, device = launcher.local_rank(), launcher.device(device)
    else:
        local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    info = DistInfo(
        rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank,
        launcher=name,
    )
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", info.local_rank)
    return info, device


def unwrap(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """``(the user's module, the DDP wrapper it came in or None)``."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        inner: torch.nn.Module = model.module
        return inner, model
    return model, None


def wrap_model(
    model: torch.nn.Module, wrapper: torch.nn.Module | None, info: DistInfo, device: torch.device
) -> torch.nn.Module:
    """The module the loop trains through: the user's DDP wrapper, a new one, or ``model``.

    An FSDP model (or any model in a single process) is trained as it is.
    """
    if wrapper is not None:
        return wrapper
    if not info.distributed or is_sharded(model):
        return model
    from torch.nn.parallel import DistributedDataParallel

    if not any(p.requires_grad for p in model.parameters()):
        return model  # nothing to synchronise (DDP refuses such a model)
    if device.type == "cuda":
        return DistributedDataParallel(model, device_ids=[device.index])
    return DistributedDataParallel(model)


def check_checkpointing(model: torch.nn.Module, callbacks: list[Any]) -> None:
    """Refuse a ``CheckpointUploader`` with an FSDP model (it uploads single files).

    Raises:
        ValueError: ``model`` is FSDP-wrapped and ``callbacks`` hold a
            ``CheckpointUploader``: an FSDP model's checkpoints are folders of shards
            written by every rank, which the uploader does not upload.
    """
    if not is_sharded(model):
        return
    if any(getattr(cb, UPLOADS_FILES_ATTR, False) is True for cb in callbacks):
        raise ValueError(
            "callbacks=[CheckpointUploader(...)] cannot upload an FSDP model's checkpoints: "
            "they are torch.distributed.checkpoint folders written by every rank, and the "
            "uploader sends single files; remove the uploader and keep the saver's folder on "
            "storage every rank shares (docs/distributed.md, 'Checkpoints')"
        )


def _plain_sampler(loader: Any) -> bool:
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

    sampler: Any = loader.sampler
    if type(sampler) is RandomSampler:
        if sampler.replacement or getattr(sampler, "_num_samples", None) is not None:
            return False
    elif type(sampler) is not SequentialSampler:
        return False
    batch_sampler = loader.batch_sampler
    return batch_sampler is None or type(batch_sampler) is BatchSampler


def shard_loader(loader: Any, info: DistInfo, *, name: str, seed: int) -> Any:
    """``loader`` with each rank reading its own ``1/world_size`` of the samples.

    A ``DataLoader`` with a ``SequentialSampler`` or ``RandomSampler`` (``shuffle=True``)
    is rebuilt with the same arguments and a ``DistributedSampler`` (shuffling with
    ``seed`` + epoch when the original shuffled). One that already has a
    ``DistributedSampler`` is kept. Anything else (a list of batches, a custom sampler,
    an ``IterableDataset``) is kept with a warning: every rank reads all of it.
    """
    from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

    if not info.distributed:
        return loader
    if isinstance(loader, DataLoader):
        if isinstance(loader.sampler, DistributedSampler):
            return loader
        if _plain_sampler(loader):
            sampler: DistributedSampler[Any] = DistributedSampler(
                loader.dataset,
                num_replicas=info.world_size,
                rank=info.rank,
                shuffle=type(loader.sampler) is RandomSampler,
                seed=seed,
                drop_last=loader.drop_last,
            )
            kwargs = {
                key: getattr(loader, key)
                for key in inspect.signature(DataLoader.__init__).parameters
                if key not in ("self", "dataset", "shuffle", "sampler", "batch_sampler")
                and hasattr(loader, key)
            }
            if not loader.num_workers:
                kwargs.pop("prefetch_factor", None)
            return type(loader)(loader.dataset, sampler=sampler, **kwargs)
    warnings.warn(
        f"{name} ({type(loader).__qualname__}) cannot be sharded by trainbus (it shards a "
        "DataLoader with a plain sampler), so every one of the "
        f"{info.world_size} ranks reads all of it; give it a DistributedSampler, or shard "
        "it by state.rank yourself",
        TrainbusWarning,
        stacklevel=3,
    )
    return loader


def runs_here(callback: object, info: DistInfo, *, sharded: bool = False) -> bool:
    """Whether ``callback`` is registered on this rank (rank-zero-only ones: rank 0 only).

    With an FSDP model (``sharded``) a ``CheckpointSaver`` runs on every rank: each rank
    writes its shards of every checkpoint (it declares :data:`WRITES_SHARDS_ATTR`).
    """
    if info.rank == 0 or not bool(getattr(callback, _RANK_ZERO_ATTR, False)):
        return True
    return sharded and getattr(callback, WRITES_SHARDS_ATTR, False) is True


def sync_gradients(ddp_model: torch.nn.Module, last: bool) -> Any:
    """A context for one microbatch: DDP's ``no_sync()`` for all but the last one."""
    from contextlib import nullcontext

    if last:  # the common case (grad_accum=1): no attribute lookup
        return nullcontext()
    no_sync = getattr(ddp_model, "no_sync", None)
    return nullcontext() if no_sync is None else no_sync()


def reduce_eval(
    sums: dict[str, torch.Tensor], total: int, device: torch.device
) -> tuple[dict[str, torch.Tensor], torch.Tensor | int]:
    """Sum the evaluation sums and sample counts of every rank (one ``all_reduce``).

    Returns the summed sums and the total count (a tensor on ``device``, so dividing by
    it needs no host sync). Every rank must report the same metric names (sorted here,
    so their order does not matter). Outside a distributed run the arguments come back
    unchanged.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return sums, total
    names = sorted(sums)
    parts = [sums[n].reshape(-1).float().to(device) for n in names]
    parts.append(torch.tensor([float(total)], device=device))
    packed = torch.cat(parts)
    dist.all_reduce(packed)
    out: dict[str, torch.Tensor] = {}
    offset = 0
    for name in names:
        size = sums[name].numel()
        out[name] = packed[offset : offset + size].reshape(sums[name].shape)
        offset += size
    return out, packed[offset]


def abort_on_failure() -> None:
    """Abort the default process group after this rank failed (training thread).

    With NCCL, peers waiting in a collective with this rank then fail at once. With gloo
    the abort does not close the connections (destroying the group would wait for its
    pending work, that is for the very peers it should release): the peers' collectives
    fail when this process exits, which the operating system's closing of its sockets
    signals at once, or after ``dist_timeout``. The group is unusable afterwards.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort is None or dist.get_backend() == "gloo":
        return
    try:
        abort()
    except Exception:  # the group may already be broken by the failure itself
        pass


@contextlib.contextmanager
def sigterm_stops(state: State, enabled: bool) -> Iterator[list[int]]:
    """While open, ``SIGTERM`` asks ``state`` to stop and is recorded in the yielded list.

    Only the first ``SIGTERM``: a second one kills the process as usual. Only on the main
    thread and where ``SIGTERM`` still has its default action (a handler the user
    installed is left alone); elsewhere this does nothing. The caller raises
    after its callbacks closed when the list is not empty.
    """
    received: list[int] = []
    if (
        not enabled
        or threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield received
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        received.append(signum)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM kills, as usual
        state.stop_training()

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


#: The flags each rank contributes at a batch boundary (reduced with MAX).
STOP, PREEMPTED, FAILED, SIGNUM = range(4)


class StopAgreement:
    """Every rank stops after the same batch, whichever rank asked (training thread).

    At each batch boundary :meth:`step` waits for the ``all_reduce`` started at the
    boundary before (it ran beside the batch in between, so the wait is normally over at
    once) and, unless that one says stop, starts this boundary's with this rank's flags
    (``[stop, preempted, failed, signum]``). The reduction runs on a gloo group of its own
    (a CPU tensor: no device sync, and DDP's gradient buckets keep their group), created at
    the start of each ``fit()`` on every rank and destroyed at its end (:meth:`close`).

    Example:
        >>> agreement = StopAgreement.create(info)   # every rank, same point
        >>> agreed = agreement.step([1, 0, 0, 0], last=False)   # None: go on
    """

    def __init__(self, group: Any) -> None:
        self.group = group
        self._pending: tuple[Any, torch.Tensor] | None = None

    @classmethod
    def create(cls, info: DistInfo) -> StopAgreement | None:
        """An agreement for a distributed run (a collective: every rank calls it), else None."""
        if not info.distributed or not (dist.is_available() and dist.is_initialized()):
            return None
        return cls(dist.new_group(backend="gloo"))

    def close(self, *, ended: bool) -> None:
        """Destroy the group at the fit's end (training thread); its gloo threads end.

        ``ended``: the loop ran to its end, as on every rank; the reduction still pending
        (an epoch-counted run's last batch boundary starts one) is waited for first, and
        every peer completes it. After a raise a pending reduction is left alone, with the
        group: destroying a gloo group waits for its pending work, that is for peers this
        rank may never meet again; the process's exit frees it.
        """
        pending, self._pending = self._pending, None
        if pending is not None:
            if not ended:
                self._pending = pending
                return
            pending[0].wait()
        group, self.group = self.group, None
        if group is not None:
            with contextlib.suppress(ValueError):  # already destroyed (with every group)
                dist.destroy_process_group(group)

    def step(self, flags: list[int], *, last: bool) -> list[int] | None:
        """The agreed flags if every rank stops at this boundary, else ``None``.

        ``last``: the run ends here anyway (``max_duration``, the same on every rank):
        nothing new is started.
        """
        pending, self._pending = self._pending, None
        if pending is not None:
            work, tensor = pending
            work.wait()
            agreed = [int(v) for v in tensor.tolist()]
            if agreed[STOP]:
                return agreed
        if not last:
            tensor = torch.tensor(flags, dtype=torch.int64)
            work = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
            self._pending = (work, tensor)
        return None

