"""Sharded checkpoints of FSDP models with ``torch.distributed.checkpoint`` (DCP).

With an FSDP model (``fully_shard``, or ``FullyShardedDataParallel``) the ``CheckpointSaver``
runs on every rank and each save is a folder that every rank writes its shards into:

- :func:`save` (training thread, every rank): the sharded state dicts of the model and the
  optimizers (``torch.distributed.checkpoint.state_dict.get_state_dict``), and this rank's
  trainer state (timestamp, schedulers, grad scaler, timer, random generators, callbacks'
  state; what a single-file checkpoint holds besides the model and optimizers) as one
  ``torch.save`` blob under the key ``trainer.rank<r>``. ``dcp.async_save`` copies them to
  host memory here and writes them on its own thread, over a process group of its own (its
  planning collectives must not interleave with training's); :class:`ShardedSave` is the
  handle the saver's writer thread waits on;
- each shard file gets a ``.crc32`` beside it before the commit, and loading checks every
  file against it first (``trainbus.checkpoint.dcp_files``: a damaged checkpoint is refused,
  and a saver's folder falls back to the newest intact one);
- the folder's ``.metadata`` file, written (to a temporary name, then renamed) by rank zero
  once every rank's shards are written, is the **commit marker**: a folder without it is an
  interrupted save, never resumed from (:func:`find_checkpoint`, the newest complete
  checkpoint of a saver's folder, file or sharded, skips it with a warning);
- :func:`check` (``Trainer`` constructor, before ``INIT``) reads the metadata and checks it
  against the model; :func:`load` (after ``INIT``, every rank) loads the model's and
  optimizers' shards each rank needs (``dcp.load`` + ``set_state_dict``) and returns the
  trainer state, which ``trainbus.checkpoint.resume`` restores as it does a single file's.

The ``.metadata`` file is a pickle (DCP's format); trainbus unpickles it through an allow-list
of DCP's metadata classes, so a hostile one is refused before any of its code runs. The byte
items of the shard files (the trainer state blob, the optimizers' plain values) go through the
same allow-list (``dcp_files.SafePlanner``), not DCP's ``torch.load(weights_only=False)``.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from trainbus.checkpoint.dcp_files import (
    ChecksumWriter,
    SafePlanner,
    SafeReader,
    UnsafeItem,
    UnsafeMetadata,
)
from trainbus.checkpoint.dcp_files import read_metadata as _read_metadata
from trainbus.checkpoint.format import TEMP_MARKER, BufferPool, capture, safe_globals
from trainbus.core.exceptions import CheckpointLoadError, CheckpointWarning

if TYPE_CHECKING:
    from trainbus.core.state import State
    from trainbus.core.timer import Timestamp

__all__ = [
    "METADATA",
    "ShardedSave",
    "check",
    "destroy_group",
    "find_checkpoint",
    "find_checkpoints",
    "folder_name",
    "folder_name_template",
    "is_complete",
    "is_interrupted",
    "is_sharded",
    "load",
    "new_group",
    "save",
]

#: The commit marker DCP writes last (rank zero, after every rank's shards).
METADATA = ".metadata"
_TRAINER_KEY = "trainer.rank{rank}"


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextlib.contextmanager
def _one_process() -> Iterator[dict[str, Any]]:
    """DCP's arguments for this process: ``no_dist=True`` (and its warning muted) without a group.

    A sharded checkpoint is saved or loaded in one process only outside an FSDP run
    (loading an FSDP run's checkpoint for evaluation, say).
    """
    if _distributed():
        yield {}
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield {"no_dist": True}


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` is FSDP-wrapped (``fully_shard``, or ``FullyShardedDataParallel``)."""
    fsdp = getattr(torch.distributed, "fsdp", None)
    if fsdp is None:  # pragma: no cover - torch without distributed support
        return False
    kinds = tuple(
        k for k in (getattr(fsdp, "FSDPModule", None), fsdp.FullyShardedDataParallel) if k
    )
    return isinstance(model, kinds)


def folder_name(filename: str, timestamp: Timestamp) -> str:
    """The folder of a sharded checkpoint: ``filename`` without ``{rank}`` and ``.pt``.

    Every rank writes into the same folder, so ``-rank{rank}`` (or ``{rank}``) is dropped:
    the default ``ep{epoch}-ba{batch}-rank{rank}.pt`` gives ``ep1-ba4``.
    """
    return folder_name_template(filename).format(**timestamp.state_dict()) or "checkpoint"


def folder_name_template(filename: str) -> str:
    """The template of :func:`folder_name`: ``filename`` without ``{rank}`` and ``.pt``."""
    name = filename.replace("-rank{rank}", "").replace("_rank{rank}", "")
    return name.replace("{rank}", "").removesuffix(".pt")


def is_complete(path: pathlib.Path) -> bool:
    """Whether ``path`` is a sharded checkpoint whose save finished (``.metadata`` present)."""
    return (path / METADATA).is_file()


def is_interrupted(path: pathlib.Path) -> bool:
    """Whether ``path`` is the folder of a sharded save that did not finish (no ``.metadata``)."""
    if not path.is_dir() or is_complete(path):
        return False
    return any(p.suffix == ".distcp" for p in path.iterdir())


def _is_candidate(path: pathlib.Path) -> bool:
    if path.name.startswith(".") or TEMP_MARKER in path.name:
        return False
    if path.is_dir():  # a sharded checkpoint: complete once its .metadata is there
        return is_complete(path)
    return path.is_file() and zipfile.is_zipfile(path)  # torch.save writes a zip archive


def _is_torn(path: pathlib.Path) -> bool:
    """A visible file that starts as a zip archive but has no directory at its end."""
    if path.name.startswith(".") or TEMP_MARKER in path.name or not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


def _mtime(path: pathlib.Path) -> tuple[int, str]:
    marker = path / METADATA if path.is_dir() else path
    return marker.stat().st_mtime_ns, path.name


def find_checkpoints(folder: pathlib.Path) -> list[pathlib.Path]:
    """The complete checkpoints in ``folder``, newest first (by modification time).

    Candidates are ``torch.save`` archives and sharded checkpoints' folders with their
    ``.metadata``. Temporary files of a write in progress (hidden, ``.<name>.partial-*``)
    never are; the folder of an interrupted sharded save (no ``.metadata``) and a torn
    archive (a zip without its directory) are skipped with a
    :class:`~trainbus.CheckpointWarning` naming them. A complete archive may still be
    damaged inside: the loader checks its CRCs (``trainbus.checkpoint.resume``).
    """
    candidates = []
    for p in sorted(folder.iterdir()):
        if _is_candidate(p):
            candidates.append(p)
        elif is_interrupted(p):
            warnings.warn(
                f"checkpoint folder {str(p)!r} has no {METADATA}: its save was "
                "interrupted; it is skipped (resuming from the newest complete checkpoint)",
                CheckpointWarning,
                stacklevel=4,
            )
        elif _is_torn(p):
            warnings.warn(
                f"checkpoint {str(p)!r} is truncated (a zip archive without its directory); "
                "it is skipped (resuming from the newest complete checkpoint)",
                CheckpointWarning,
                stacklevel=4,
            )
    return sorted(candidates, key=_mtime, reverse=True)


def find_checkpoint(folder: pathlib.Path) -> pathlib.Path | None:
    """The newest complete checkpoint in ``folder`` (see :func:`find_checkpoints`), or ``None``."""
    found = find_checkpoints(folder)
    return found[0] if found else None


@dataclass
class ShardedSave:
    """A sharded save in flight: staged in host memory, written by DCP's thread.

    Attributes:
        future: DCP's future of the write (it completes after the ``.metadata`` is written).
        host_bytes: Bytes of tensor data this rank staged.
        buffers: Always empty (DCP stages into buffers of its own).
    """

    future: Any
    host_bytes: int = 0
    buffers: BufferPool = field(default_factory=dict)

    def write(self, path: pathlib.Path) -> int:
        """Wait until the checkpoint is written and committed (writer thread); its bytes here."""
        self.future.result()
        return sum(
            p.stat().st_size
            for p in path.iterdir()
            if p.name.startswith(f"__{_rank()}_") and p.suffix == ".distcp"
        )


def _state_dicts(state: State, weights_only: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if weights_only or not state.optimizers:
        return get_model_state_dict(state.model), {}
    model_sd, optim_sd = get_state_dict(state.model, state.optimizers)
    return model_sd, optim_sd


def _nbytes(obj: Any) -> int:
    shards = getattr(obj, "local_shards", None)  # FSDP1's ShardedTensor
    if callable(shards):
        return sum(_nbytes(shard.tensor) for shard in shards())
    if isinstance(obj, torch.Tensor):
        local = getattr(obj, "to_local", None)
        t = local() if callable(local) else obj
        return int(t.numel() * t.element_size())
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_nbytes(v) for v in obj)
    return 0


def new_group() -> Any:
    """A gloo process group for DCP's collectives (``None`` in a single process).

    Collective: every rank calls it at the same point (its first sharded save). DCP's planning
    collectives run on its writing thread; on a group of their own they cannot interleave
    with training's collectives on the default group. A gloo group: the caller registers
    :mod:`trainbus.runtime.gloo_exit`'s guard (``CheckpointSaver`` does), which this layer,
    below ``runtime/``, does not import.
    """
    if not _distributed():
        return None
    try:  # the default group's timeout (the Trainer's dist_timeout), not gloo's 30 minutes
        world: Any = dist.group.WORLD
        timeout = world._get_backend(torch.device("cpu")).options._timeout
    except Exception:  # no CPU backend on the default group, or another torch
        timeout = None
    return dist.new_group(backend="gloo", timeout=timeout)


def destroy_group(group: Any) -> None:
    """Destroy the group of :func:`new_group` (at the saver's close; its threads then end)."""
    if group is None or not _distributed():
        return
    with contextlib.suppress(ValueError):  # already destroyed (with every group)
        dist.destroy_process_group(group)


def save(
    state: State,
    path: pathlib.Path,
    weights_only: bool,
    epoch_rng: torch.Tensor | None,
    group: Any,
) -> ShardedSave:
    """Start a sharded save of ``state`` into the folder ``path`` (training thread, every rank).

    Returns once DCP has staged a copy in host memory (training may change the live
    tensors then); the write goes on beside training. ``group`` is the process group for
    DCP's collectives (one of its own). Without ``dcp.async_save`` (an old torch) the
    save is synchronous and the returned handle is complete.
    """
    from concurrent.futures import Future

    from torch.distributed.checkpoint import state_dict_saver

    trainer = capture(state, weights_only=weights_only, epoch_rng=epoch_rng, include_model=False)
    trainer.wait()
    payload = dict(trainer.payload, optimizer_count=len(state.optimizers))
    blob = io.BytesIO()
    torch.save(payload, blob)
    model_sd, optim_sd = _state_dicts(state, weights_only)
    to_save: dict[str, Any] = {"model": model_sd}
    to_save[_TRAINER_KEY.format(rank=_rank())] = blob.getvalue()
    if optim_sd:
        to_save["optimizers"] = optim_sd
    writer = ChecksumWriter(str(path))
    async_save = getattr(state_dict_saver, "async_save", None)
    if async_save is None or not _distributed():  # torch < 2.3, or a single process
        done: Future[Any] = Future()
        with _one_process() as kwargs:
            done.set_result(
                state_dict_saver.save(to_save, storage_writer=writer, process_group=group, **kwargs)
            )
        return ShardedSave(done, _nbytes(to_save))
    response = async_save(to_save, storage_writer=writer, process_group=group)
    future = getattr(response, "upload_completion", response)  # AsyncSaveResponse (2.9+)
    return ShardedSave(future, _nbytes(to_save))


def _metadata(path: pathlib.Path) -> Any:
    try:
        return _read_metadata(path)
    except UnsafeMetadata as exc:
        raise CheckpointLoadError(
            f"load_path={str(path)!r}: its {METADATA} names {exc.global_name}, which a "
            "torch.distributed.checkpoint metadata never holds; it was refused unread (nothing "
            "of it ran): the file was not written by torch.distributed.checkpoint, or is "
            f"hostile. Remove {str(path)!r} (or pass another load_path)"
        ) from None
    except Exception as exc:
        raise CheckpointLoadError(
            f"load_path={str(path)!r}: its {METADATA} cannot be read as a "
            f"torch.distributed.checkpoint ({type(exc).__name__}: {exc}); the folder is "
            "corrupt or not a checkpoint"
        ) from exc


def check(path: pathlib.Path, state: State) -> None:
    """Check the sharded checkpoint at ``path`` against ``state``'s model (no tensor is read).

    Raises:
        CheckpointLoadError: ``path`` has no ``.metadata`` (an interrupted save), or holds
            no trainbus trainer state, or another model's parameters (names or shapes).
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    if not is_complete(path):
        raise CheckpointLoadError(
            f"load_path={str(path)!r} has no {METADATA}: its save was interrupted, so it is "
            "not a complete checkpoint; pass the saver's folder to resume from its newest "
            "complete checkpoint"
        )
    saved = _metadata(path).state_dict_metadata
    if not any(k.startswith("trainer.rank") for k in saved):
        raise CheckpointLoadError(
            f"load_path={str(path)!r} is a torch.distributed.checkpoint without trainbus's "
            "trainer state; pass a folder written by trainbus.callbacks.CheckpointSaver"
        )
    own = get_model_state_dict(state.model)
    names = {k.removeprefix("model.") for k in saved if k.startswith("model.")}
    problems = []
    if missing := sorted(set(own) - names):
        problems.append(f"missing from the checkpoint: {', '.join(missing[:5])}")
    if unexpected := sorted(names - set(own)):
        problems.append(f"not in the model: {', '.join(unexpected[:5])}")
    shapes = [
        f"{k}: checkpoint {tuple(saved['model.' + k].size)} vs model {tuple(v.shape)}"
        for k, v in own.items()
        if k in names
        and isinstance(v, torch.Tensor)
        and hasattr(saved["model." + k], "size")
        and tuple(saved["model." + k].size) != tuple(v.shape)
    ]
    if shapes:
        problems.append(f"shapes differ: {'; '.join(shapes[:5])}")
    if problems:
        raise CheckpointLoadError(
            f"load_path={str(path)!r} is a checkpoint of another model "
            f"({type(state.model).__name__} does not match): {' | '.join(problems)}"
        )


def _unsafe_item(exc: BaseException) -> UnsafeItem | None:
    """The :class:`UnsafeItem` inside DCP's ``CheckpointException`` (its ranks' failures)."""
    for failure in getattr(exc, "failures", {}).values():
        inner = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(inner, UnsafeItem):
            return inner
    return None


def _refused(path: pathlib.Path, exc: UnsafeItem) -> CheckpointLoadError:
    return CheckpointLoadError(
        f"load_path={str(path)!r}: its item {exc.item!r} names {exc.global_name}, which "
        "trainbus never writes into a checkpoint; it was refused unread (nothing of it ran): "
        f"the folder was not written by trainbus, or is hostile. Remove {str(path)!r} (or "
        "pass another load_path)"
    )


def load(path: pathlib.Path, state: State) -> dict[str, Any]:
    """Load the model's and optimizers' shards into ``state`` (every rank); the trainer state.

    Each rank reads the shards its own parameters need (DCP reshards when the saving
    run had another world size) and its own trainer state (rank zero's when the saving
    run had no such rank).

    Raises:
        CheckpointLoadError: The checkpoint holds another number of optimizers than the
            trainer, or cannot be read.
    """
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    saved = _metadata(path).state_dict_metadata
    key = _TRAINER_KEY.format(rank=_rank())
    if key not in saved:
        key = _TRAINER_KEY.format(rank=0)
    has_optimizers = any(k.startswith("optimizers.") for k in saved)
    model_sd, optim_sd = _state_dicts(state, weights_only=not has_optimizers)
    to_load: dict[str, Any] = {"model": model_sd, key: b""}
    if has_optimizers and optim_sd:
        to_load["optimizers"] = optim_sd
    try:
        with _one_process() as kwargs:
            dcp_load(to_load, storage_reader=SafeReader(str(path)), planner=SafePlanner(), **kwargs)
        with safe_globals():
            trainer: dict[str, Any] = torch.load(
                io.BytesIO(to_load[key]), map_location="cpu", weights_only=True
            )
    except UnsafeItem as exc:
        raise _refused(path, exc) from None
    except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
        if (unsafe := _unsafe_item(exc)) is not None:
            raise _refused(path, unsafe) from None
        raise CheckpointLoadError(
            f"load_path={str(path)!r} cannot be loaded into this run "
            f"({type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''})"
        ) from exc
    count = trainer.get("optimizer_count", 0)
    if not trainer.get("weights_only") and count != len(state.optimizers):
        raise CheckpointLoadError(
            f"load_path={str(path)!r} holds {count} optimizers but the trainer has "
            f"{len(state.optimizers)}; pass the same optimizers as the run that saved it"
        )
    if "optimizers" in to_load:
        set_state_dict(
            state.model,
            state.optimizers,
            model_state_dict=to_load["model"],
            optim_state_dict=to_load["optimizers"],
        )
    else:
        set_model_state_dict(state.model, to_load["model"])
    return trainer
