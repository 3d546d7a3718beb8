"""Loading a checkpoint, and the hooks the loop uses to resume exactly where it stopped.

``Trainer(load_path=...)`` calls :func:`read_checkpoint` before ``INIT`` (it finds the file,
or the newest complete checkpoint in a saver's folder, loads it with
``torch.load(weights_only=True)`` and checks it against the model) and
:func:`restore_checkpoint` after it (model, optimizers, schedulers, grad scaler, timer and
callback state). What must happen later, on the training thread, is kept in a
:class:`ResumePoint` attached to the state: the loop's :func:`epoch_batches` rebuilds the
interrupted epoch's data order, skips the batches already consumed and only then restores
the random generators, so the resumed run draws the same random numbers as the
uninterrupted one.

The Trainer also attaches the bus's "wait for every handler published so far" to the state
(:func:`attach_handler_drain`), which the saver calls before it captures callback state.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import random
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from trainbus.checkpoint import dcp_files as _dcp_files
from trainbus.checkpoint import sharded as _dcp
from trainbus.checkpoint.format import (
    FORMAT_KEY,
    ArchiveDamaged,
    callback_keys,
    capture_rng,
    safe_globals,
    verify_archive,
)
from trainbus.checkpoint.sharded import find_checkpoint, find_checkpoints
from trainbus.core.exceptions import CheckpointLoadError, CheckpointWarning

if TYPE_CHECKING:
    from trainbus.checkpoint.s3 import S3Options
    from trainbus.core.state import State

__all__ = [
    "LoadedCheckpoint",
    "ResumePoint",
    "attach_handler_drain",
    "epoch_batches",
    "find_checkpoint",
    "load_checkpoint",
    "read_checkpoint",
    "restore_checkpoint",
    "wait_for_handlers",
]

_RESUME_ATTR = "_trainbus_resume"
_EPOCH_RNG_ATTR = "_trainbus_epoch_rng"
_DRAIN_ATTR = "_trainbus_wait_handlers"
_SAVER_KEY = "trainbus.callbacks.checkpoint_saver.CheckpointSaver#"


@dataclass
class ResumePoint:
    """What the loop still has to restore, on the training thread, after a load.

    Attributes:
        path: The checkpoint it came from.
        rng: Generator states to restore just before the first resumed batch.
        epoch_rng: torch's generator state when the interrupted epoch's iterator was made.
    """

    path: pathlib.Path
    rng: dict[str, Any] | None
    epoch_rng: torch.Tensor | None


class _Damaged(CheckpointLoadError):
    """The file fails its integrity check (torn, or a CRC-32 mismatch): try an older one."""


def _read(path: pathlib.Path) -> dict[str, Any]:
    try:
        verify_archive(path)  # torch.load never checks the CRC-32s its archive records
    except FileNotFoundError:
        pass  # torch.load below says so, with the fix
    except ArchiveDamaged as exc:
        raise _Damaged(
            f"load_path={str(path)!r} cannot be read as a checkpoint: it is truncated or "
            f"corrupt ({exc})"
        ) from exc
    try:
        with safe_globals():
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointLoadError(
            f"load_path={str(path)!r} does not exist; pass a checkpoint file or the folder "
            "of a CheckpointSaver"
        ) from None
    except Exception as exc:
        what = str(exc).strip().splitlines()
        detail = next((line for line in what if "error" in line.lower()), what[0] if what else "")
        raise CheckpointLoadError(
            f"load_path={str(path)!r} cannot be read as a checkpoint: it is truncated or "
            f"corrupt, or holds types not allowed with weights_only=True ({detail.strip()}); "
            "a callback's state_dict() may hold only tensors, plain containers and numbers, "
            "or add your type with torch.serialization.add_safe_globals([...])"
        ) from exc
    if not isinstance(obj, dict) or obj.get(FORMAT_KEY) is None:
        raise CheckpointLoadError(
            f"load_path={str(path)!r} is not a trainbus checkpoint (no {FORMAT_KEY!r} key); "
            "pass a file written by trainbus.callbacks.CheckpointSaver"
        )
    return obj


def _verify_sharded(path: pathlib.Path) -> None:
    """Every file of a sharded checkpoint against its CRC-32 (``dcp_files.verify``)."""
    try:
        _dcp_files.verify(path)
    except ArchiveDamaged as exc:
        raise _Damaged(
            f"load_path={str(path)!r} cannot be read as a checkpoint: it is truncated or "
            f"corrupt ({exc})"
        ) from exc


def _check_model(path: pathlib.Path, model: torch.nn.Module, saved: dict[str, Any]) -> None:
    own = model.state_dict()
    missing = sorted(set(own) - set(saved))
    unexpected = sorted(set(saved) - set(own))
    shapes = [
        f"{k}: checkpoint {tuple(saved[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in saved
        and isinstance(saved[k], torch.Tensor)
        and isinstance(own[k], torch.Tensor)
        and saved[k].shape != own[k].shape
    ]
    problems = []
    if missing:
        problems.append(f"missing from the checkpoint: {', '.join(missing[:5])}")
    if unexpected:
        problems.append(f"not in the model: {', '.join(unexpected[:5])}")
    if shapes:
        problems.append(f"shapes differ: {'; '.join(shapes[:5])}")
    if problems:
        raise CheckpointLoadError(
            f"load_path={str(path)!r} is a checkpoint of another model ({type(model).__name__} "
            f"does not match): {' | '.join(problems)}"
        )


def _load_parts(path: pathlib.Path, what: str, objs: list[Any], states: list[Any]) -> None:
    if len(objs) != len(states):
        raise CheckpointLoadError(
            f"load_path={str(path)!r} holds {len(states)} {what} but the trainer has "
            f"{len(objs)}; pass the same {what} as the run that saved it"
        )
    for i, (obj, obj_state) in enumerate(zip(objs, states, strict=True)):
        try:
            obj.load_state_dict(obj_state)
        except (ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointLoadError(
                f"load_path={str(path)!r}: {what}[{i}] ({type(obj).__name__}) does not match "
                f"the checkpoint: {exc}"
            ) from exc


def _load_callbacks(path: pathlib.Path, state: State, saved: dict[str, Any]) -> None:
    seen = set()
    for key, cb in callback_keys(state.callbacks):
        if key in saved:
            seen.add(key)
            cb.load_state_dict(saved[key])
        elif cb.state_dict():
            warnings.warn(
                f"callback {key} has state but is not in checkpoint {str(path)!r}; it starts fresh",
                CheckpointWarning,
                stacklevel=4,
            )
    for key in sorted(set(saved) - seen):
        if key.startswith(_SAVER_KEY):  # its list of written files is bookkeeping only
            continue
        warnings.warn(
            f"checkpoint {str(path)!r} holds the state of callback {key}, which is not in "
            "this run; its state is ignored",
            CheckpointWarning,
            stacklevel=4,
        )


def _is_saver_folder(path: pathlib.Path, saver_folders: Sequence[pathlib.Path]) -> bool:
    target = path.resolve()
    return any(folder.resolve() == target for folder in saver_folders)


@dataclass
class LoadedCheckpoint:
    """A checkpoint read and checked against the run, not yet restored.

    Attributes:
        path: The file it was read from (a folder for a sharded checkpoint).
        contents: The checkpoint dict (empty for a sharded checkpoint until restored).
        sharded: A ``torch.distributed.checkpoint`` folder (an FSDP run's).
    """

    path: pathlib.Path
    contents: dict[str, Any]
    sharded: bool = False


def read_checkpoint(
    load_path: str | os.PathLike[str],
    state: State,
    *,
    saver_folders: Sequence[pathlib.Path] = (),
    s3_options: S3Options | None = None,
) -> LoadedCheckpoint | None:
    """Find and read the checkpoint at ``load_path``; check it fits ``state``'s model.

    The caller (the Trainer) says what the run's callbacks write: ``saver_folders``, the
    folders of its ``CheckpointSaver``s, and ``s3_options``, the endpoint and credentials of
    its ``CheckpointUploader`` to ``load_path``, if any.

    Returns ``None`` for a folder without a complete checkpoint, for a path that does
    not exist yet but is the folder of one of the run's ``CheckpointSaver``s (so one
    command line both starts and resumes a job), and for an ``s3://bucket/prefix`` without
    a complete checkpoint (a ``CheckpointUploader`` of the run to that URL lends its
    endpoint and credentials; otherwise the AWS environment variables apply).

    Raises:
        TypeError: ``load_path`` is not a path.
        CheckpointLoadError: The path does not exist; the file is truncated, corrupt or
            not a trainbus checkpoint; or it is a checkpoint of another model (or with
            another number of optimizers or schedulers). The message names the path and
            what does not match.
    """
    if not isinstance(load_path, str | os.PathLike):
        raise TypeError(
            f"load_path={load_path!r} must be a path (str or os.PathLike) to a checkpoint "
            "file or a CheckpointSaver folder"
        )
    if isinstance(load_path, str) and load_path.startswith("s3://"):
        return _read_remote(load_path, state, s3_options)
    path = pathlib.Path(load_path)
    if not path.exists() and _is_saver_folder(path, saver_folders):
        return None  # autoresume's first run: the saver has not made its folder yet
    if path.is_dir() and not (_dcp.is_complete(path) or _dcp.is_interrupted(path)):
        return _read_newest_intact(path, state)
    if path.is_dir():
        if _dcp.is_complete(path):
            try:
                _verify_sharded(path)
            except _Damaged as exc:
                raise CheckpointLoadError(str(exc)) from exc.__cause__
        _dcp.check(path, state)
        return LoadedCheckpoint(path, {}, sharded=True)
    return _read_one(path, state)


def _read_one(path: pathlib.Path, state: State) -> LoadedCheckpoint:
    """:func:`_read_checked`, a damaged file raised as a plain :class:`CheckpointLoadError`."""
    try:
        return _read_checked(path, state)
    except _Damaged as exc:
        raise CheckpointLoadError(str(exc)) from exc.__cause__


def _read_newest_intact(folder: pathlib.Path, state: State) -> LoadedCheckpoint | None:
    """The newest checkpoint in ``folder`` that passes its integrity check.

    A damaged one (a CRC-32 mismatch in a file or a sharded checkpoint's shard, a torn
    archive) is skipped with a
    :class:`~trainbus.CheckpointWarning` naming it; other errors (another model) raise, and
    so does a folder whose every checkpoint is damaged (rather than start over silently).
    """
    damaged: _Damaged | None = None
    for path in find_checkpoints(folder):
        try:
            if path.is_dir():
                _verify_sharded(path)
                _dcp.check(path, state)
                return LoadedCheckpoint(path, {}, sharded=True)
            return _read_checked(path, state)
        except _Damaged as exc:
            damaged = damaged or exc
            warnings.warn(
                f"checkpoint {str(path)!r} is damaged ({exc.__cause__}); it is skipped "
                "(resuming from the newest intact checkpoint)",
                CheckpointWarning,
                stacklevel=4,
            )
    if damaged is not None:
        raise CheckpointLoadError(
            f"load_path={str(folder)!r}: every checkpoint in the folder is damaged (the "
            f"newest: {damaged}); restore one from a copy, or remove them to start over"
        ) from damaged.__cause__
    return None


def _read_remote(url: str, state: State, options: S3Options | None) -> LoadedCheckpoint | None:
    """The newest complete checkpoint under ``s3://bucket/prefix`` (``trainbus.checkpoint.s3``)."""
    from trainbus.checkpoint.s3 import S3Options, download_newest

    options = options or S3Options()
    skip: frozenset[str] = frozenset()
    while True:
        got = download_newest(url, options, _dcp._rank(), skip)
        if got is None:
            if skip:  # every complete checkpoint there is damaged: do not start over
                raise CheckpointLoadError(
                    f"load_path={url!r}: every checkpoint in its manifest is damaged "
                    f"({', '.join(sorted(skip))}); restore one, or use another prefix"
                )
            return None  # no complete checkpoint there yet: a first run starts fresh
        where, local = got
        try:
            return _read_checked(local, state)
        except _Damaged as exc:  # the newest intact one instead, as in a folder
            warnings.warn(
                f"checkpoint {where!r} is damaged ({exc.__cause__}); it is skipped "
                "(resuming from the newest intact checkpoint)",
                CheckpointWarning,
                stacklevel=4,
            )
            skip = skip | {where[len(url.rstrip("/")) + 1 :]}
        except CheckpointLoadError as exc:
            raise CheckpointLoadError(str(exc).replace(str(local), where)) from exc.__cause__
        finally:
            local.unlink(missing_ok=True)  # loaded into memory (or refused) by now


def _read_checked(path: pathlib.Path, state: State) -> LoadedCheckpoint:
    if _dcp.is_sharded(state.model):
        raise CheckpointLoadError(
            f"load_path={str(path)!r} is a single-file checkpoint, which an FSDP model does not "
            "load; resume an FSDP run from a torch.distributed.checkpoint folder written by "
            "CheckpointSaver with an FSDP model"
        )
    ckpt = _read(path)
    _check_model(path, state.model, ckpt.get("model", {}))
    if not ckpt.get("weights_only"):
        for what, objs in (("optimizers", state.optimizers), ("schedulers", state.schedulers)):
            if len(objs) != len(ckpt.get(what, [])):
                raise CheckpointLoadError(
                    f"load_path={str(path)!r} holds {len(ckpt.get(what, []))} {what} but the "
                    f"trainer has {len(objs)}; pass the same {what} as the run that saved it"
                )
    return LoadedCheckpoint(path, ckpt)


def restore_checkpoint(loaded: LoadedCheckpoint, state: State) -> ResumePoint | None:
    """Restore ``state`` from a checkpoint read by :func:`read_checkpoint`.

    Restores the model, optimizers, schedulers, grad scaler, timer and callback state now,
    and attaches a :class:`ResumePoint` for :func:`epoch_batches` (returned; ``None`` for a
    weights-only checkpoint, after which training starts from the beginning).
    """
    path, ckpt = loaded.path, loaded.contents
    if loaded.sharded:  # every rank loads its shards of the model and optimizers
        ckpt = _dcp.load(path, state)
    else:
        state.model.load_state_dict(ckpt["model"])
    if ckpt.get("weights_only"):
        return None
    if not loaded.sharded:
        _load_parts(path, "optimizers", state.optimizers, ckpt.get("optimizers", []))
    _load_parts(path, "schedulers", state.schedulers, ckpt.get("schedulers", []))
    scaler = getattr(state, "scaler", None)
    if scaler is not None and ckpt.get("scaler") is not None:
        scaler.load_state_dict(ckpt["scaler"])
    state._timer.load_state_dict(ckpt["timer"])
    _load_callbacks(path, state, ckpt.get("callbacks", {}))
    point = ResumePoint(path, ckpt.get("rng"), ckpt.get("epoch_rng"))
    setattr(state, _RESUME_ATTR, point)
    return point


def load_checkpoint(load_path: str | os.PathLike[str], state: State) -> ResumePoint | None:
    """:func:`read_checkpoint`, then :func:`restore_checkpoint` (``None`` if nothing to load)."""
    loaded = read_checkpoint(load_path, state)
    return None if loaded is None else restore_checkpoint(loaded, state)


def _restore_rng(rng: dict[str, Any]) -> None:
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(rng["torch"])
    if "numpy" in rng:
        import numpy as np

        n = rng["numpy"]
        np.random.set_state(
            (n["bit_generator"], np.array(n["key"], dtype=np.uint32), n["pos"],
             n["has_gauss"], n["gauss"])
        )  # fmt: skip
    if "cuda" in rng and torch.cuda.is_available():
        states = rng["cuda"][: torch.cuda.device_count()]
        torch.cuda.set_rng_state_all(states)


def epoch_rng(state: State) -> torch.Tensor | None:
    """torch's generator state when the current epoch's data iterator was made."""
    value: torch.Tensor | None = getattr(state, _EPOCH_RNG_ATTR, None)
    return value


def epoch_batches(state: State, skip: int) -> Iterator[Any]:
    """The iterator over this epoch's training batches, ``skip`` of them consumed already.

    Called by the loop at the start of each epoch (training thread). Tells the sampler
    which epoch it is (``set_epoch``, as ``DistributedSampler`` needs), remembers torch's
    generator state before making the iterator (saved in checkpoints), and on the first
    epoch after a resume rebuilds the interrupted epoch's order from that state, consumes
    the ``skip`` batches already trained on, and then restores the generators saved with
    the checkpoint.
    """
    loader = state.train_dataloader
    epoch = int(state.timestamp.epoch)
    holders = (loader, getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None))
    for holder in holders:
        set_epoch: Callable[[int], None] | None = getattr(holder, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
    point: ResumePoint | None = getattr(state, _RESUME_ATTR, None)
    setattr(state, _RESUME_ATTR, None)
    if not skip:
        if point is not None and point.rng is not None:
            _restore_rng(point.rng)
        setattr(state, _EPOCH_RNG_ATTR, torch.get_rng_state())
        return iter(loader)
    # Mid-epoch (a resume, or fit(duration=...) continuing a run): rebuild the epoch's
    # order from the generator state it was made with, consume what was trained on,
    # then put the generators where the run left them.
    start_rng = point.epoch_rng if point is not None else epoch_rng(state)
    after = point.rng if point is not None else capture_rng()
    if start_rng is not None:
        torch.set_rng_state(start_rng)
    setattr(state, _EPOCH_RNG_ATTR, torch.get_rng_state())
    batches: Iterator[Any] = iter(loader)
    for _ in itertools.islice(batches, skip):
        pass
    if after is not None:
        _restore_rng(after)
    return batches


def attach_handler_drain(state: State, wait_all: Callable[[], None]) -> None:
    """Give the saver a way to wait for every queued handler (set by the Trainer)."""
    setattr(state, _DRAIN_ATTR, wait_all)


def wait_for_handlers(state: State) -> bool:
    """Wait, on the training thread, until every handler published so far has finished.

    Returns ``False`` when the run is stopping (a handler failed, or ``fit()`` was
    cancelled): the caller should not save. Without a trainer (plain ``engine`` use)
    there is nothing to wait for and it returns ``True``.
    """
    drain: Callable[[], None] | None = getattr(state, _DRAIN_ATTR, None)
    if drain is None:
        return True
    try:
        drain()
    except Exception:  # the bus is stopping: the next event unwinds the training thread
        return False
    return True
