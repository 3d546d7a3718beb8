"""Sharded checkpoints' integrity and safe loading, and the saver's one save in flight.

One process (a plain model saved through the sharded path, as an FSDP rank writes it): a
flipped bit in a shard or in the trainer state blob is refused at load, and a saver's folder
falls back to the newest intact checkpoint with a warning; a hostile ``.metadata`` (its
unpickling would create a file) is refused without running, passed as ``load_path`` or
planted in a saver's folder under a newer name; so is a DCP folder whose ``.metadata`` is
DCP's own but whose shard file carries a hostile byte item (``trainer.rank0``). The
two-process FSDP case is in ``tests/test_fsdp.py``.
"""

from __future__ import annotations

import os
import pathlib
import pickle
import threading
import warnings
from typing import Any

import pytest
import torch

from trainbus import Callback, CheckpointLoadError, CheckpointWarning, Trainer, blocking
from trainbus.callbacks import CheckpointSaver
from trainbus.checkpoint.dcp_files import read_metadata
from trainbus.checkpoint.sharded import save as sharded_save

from .helpers import TinyModel, make_loader


def _trainer(duration: str = "2ep", **kw: Any) -> Trainer:
    model = TinyModel()
    return Trainer(
        model, make_loader(4), duration, optimizers=torch.optim.Adam(model.parameters()),
        device="cpu", seed=3, **kw,
    )  # fmt: skip


def _save(trainer: Trainer, path: pathlib.Path, mtime_ns: int | None = None) -> pathlib.Path:
    sharded_save(trainer.state, path, weights_only=False, epoch_rng=None, group=None).write(path)
    if mtime_ns is not None:  # the .metadata's time orders a folder's checkpoints
        os.utime(path / ".metadata", ns=(mtime_ns, mtime_ns))
    return path


def _flip(path: pathlib.Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def _blob_offset(path: pathlib.Path) -> int:
    """Where the trainer state blob (``trainer.rank0``) lies in its shard file."""
    storage = read_metadata(path).storage_data
    info = next(v for k, v in storage.items() if k.fqn == "trainer.rank0")
    return int(info.offset) + int(info.length) // 2


@pytest.fixture
def one_epoch(tmp_path: pathlib.Path) -> Trainer:
    trainer = _trainer("1ep")
    trainer.fit_sync()
    return trainer


def test_every_shard_and_the_metadata_get_a_checksum(
    tmp_path: pathlib.Path, one_epoch: Trainer
) -> None:
    path = _save(one_epoch, tmp_path / "ep1-ba4")
    assert sorted(p.name for p in path.iterdir()) == [
        ".metadata", ".metadata.crc32", "__0_0.distcp", "__0_0.distcp.crc32",
    ]  # fmt: skip
    assert int(_trainer(load_path=path).state.timer.batch) == 4  # an intact one loads


@pytest.mark.parametrize("where", ["tensor data", "trainer blob"])
def test_a_flipped_bit_in_a_shard_is_refused_at_load(
    tmp_path: pathlib.Path, one_epoch: Trainer, where: str
) -> None:
    path = _save(one_epoch, tmp_path / "ep1-ba4")
    shard = path / "__0_0.distcp"
    _flip(shard, 200 if where == "tensor data" else _blob_offset(path))
    with pytest.raises(CheckpointLoadError, match=r"'__0_0.distcp' fails its CRC-32 check"):
        _trainer(load_path=path)


def test_a_truncated_or_missing_shard_is_refused(
    tmp_path: pathlib.Path, one_epoch: Trainer
) -> None:
    path = _save(one_epoch, tmp_path / "ep1-ba4")
    shard = path / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(CheckpointLoadError, match="truncated"):
        _trainer(load_path=path)
    shard.unlink()
    with pytest.raises(CheckpointLoadError, match=r"'__0_0\.distcp' is missing"):
        _trainer(load_path=path)


def test_a_saver_folder_falls_back_to_the_newest_intact_checkpoint(
    tmp_path: pathlib.Path,
) -> None:
    first = _trainer("1ep")
    first.fit_sync()
    _save(first, tmp_path / "ep1-ba4", mtime_ns=10**18)
    first.fit_sync(duration="1ep")
    newest = _save(first, tmp_path / "ep2-ba8", mtime_ns=2 * 10**18)
    _flip(newest / "__0_0.distcp", _blob_offset(newest))
    with pytest.warns(CheckpointWarning, match=r"ep2-ba8'? is damaged .*CRC-32.*; it is skipped"):
        resumed = _trainer(load_path=tmp_path)
    assert int(resumed.state.timer.batch) == 4  # from ep1-ba4, the newest intact one
    _flip(tmp_path / "ep1-ba4" / "__0_0.distcp", 200)
    with pytest.warns(CheckpointWarning), pytest.raises(CheckpointLoadError, match="every"):
        _trainer(load_path=tmp_path)  # all damaged: refused, not started over


class _Hostile:
    """Unpickling it opens (creates) ``marker``: what a hostile ``.metadata`` could do."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (open, (str(self.marker), "w"))


def _plant(folder: pathlib.Path, marker: pathlib.Path) -> pathlib.Path:
    """A folder that looks like a complete sharded checkpoint, its ``.metadata`` hostile."""
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(b"\0" * 64)
    (folder / ".metadata").write_bytes(pickle.dumps(_Hostile(marker)))
    return folder


def test_a_hostile_metadata_passed_as_load_path_does_not_run(tmp_path: pathlib.Path) -> None:
    marker = tmp_path / "marker"
    hostile = _plant(tmp_path / "ckpt", marker)
    with pytest.raises(CheckpointLoadError, match=r"names _?io.open, .*refused unread"):
        _trainer(load_path=hostile)
    assert not marker.exists()


def test_a_hostile_metadata_planted_in_a_saver_folder_does_not_run(
    tmp_path: pathlib.Path, one_epoch: Trainer
) -> None:
    marker = tmp_path / "marker"
    folder = tmp_path / "ckpt"
    _save(one_epoch, folder / "ep1-ba4", mtime_ns=10**18)
    _plant(folder / "ep9-ba999-rank0", marker)  # newer by name and by time
    with pytest.raises(CheckpointLoadError, match=r"ep9-ba999-rank0'?: its \.metadata names"):
        _trainer(load_path=folder, callbacks=[CheckpointSaver(folder)])
    assert not marker.exists()


def _plant_item(trainer: Trainer, folder: pathlib.Path, marker: pathlib.Path) -> pathlib.Path:
    """A DCP checkpoint written by DCP itself (its ``.metadata`` DCP's own, ``.crc32`` files
    in trainbus's format) whose byte item ``trainer.rank0`` is a hostile pickle."""
    from torch.distributed.checkpoint import state_dict_saver
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from trainbus.checkpoint.dcp_files import ChecksumWriter

    model_sd, optim_sd = get_state_dict(trainer.state.model, trainer.state.optimizers)
    to_save = {"model": model_sd, "optimizers": optim_sd, "trainer.rank0": _Hostile(marker)}
    with warnings.catch_warnings():  # DCP warns that it runs without a process group
        warnings.simplefilter("ignore", UserWarning)
        state_dict_saver.save(to_save, storage_writer=ChecksumWriter(str(folder)), no_dist=True)
    assert sorted(p.name for p in folder.iterdir()) == [
        ".metadata", ".metadata.crc32", "__0_0.distcp", "__0_0.distcp.crc32",
    ]  # fmt: skip
    return folder


def test_a_hostile_byte_item_passed_as_load_path_does_not_run(
    tmp_path: pathlib.Path, one_epoch: Trainer
) -> None:
    marker = tmp_path / "marker"
    hostile = _plant_item(one_epoch, tmp_path / "ckpt", marker)
    with pytest.raises(
        CheckpointLoadError, match=r"its item 'trainer\.rank0' names _?io\.open, .*refused unread"
    ):
        _trainer(load_path=hostile)
    assert not marker.exists()


def test_a_hostile_byte_item_planted_in_a_saver_folder_does_not_run(
    tmp_path: pathlib.Path, one_epoch: Trainer
) -> None:
    marker = tmp_path / "marker"
    folder = tmp_path / "ckpt"
    _save(one_epoch, folder / "ep1-ba4", mtime_ns=10**18)
    _plant_item(one_epoch, folder / "ep9-ba999", marker)  # newer by name and by time
    with pytest.raises(CheckpointLoadError, match=r"ep9-ba999'?: its item 'trainer\.rank0' names"):
        _trainer(load_path=folder, callbacks=[CheckpointSaver(folder)])
    assert not marker.exists()


def test_the_byte_items_trainbus_writes_pass_the_allow_list(
    tmp_path: pathlib.Path, one_epoch: Trainer
) -> None:
    """Every byte item of a real save (trainer blob, Adam's plain values) loads through it."""
    from trainbus.checkpoint.dcp_files import load_item

    path = _save(one_epoch, tmp_path / "ep1-ba4")
    meta = read_metadata(path)
    shard = (path / "__0_0.distcp").read_bytes()
    items = {
        k.fqn: shard[int(v.offset) : int(v.offset) + int(v.length)]
        for k, v in meta.storage_data.items()
        if type(meta.state_dict_metadata[k.fqn]).__name__ == "BytesStorageMetadata"
    }
    assert "trainer.rank0" in items and len(items) > 1, sorted(items)
    loaded = {k: load_item(v, k) for k, v in items.items()}
    assert isinstance(loaded["trainer.rank0"], bytes)
    resumed = _trainer(load_path=path)  # and the whole load goes through it
    assert int(resumed.state.timer.batch) == 4


# -- the saver: one save in flight, memory flat ----------------------------------------------


def test_a_save_due_while_one_is_written_waits_for_it_and_none_is_skipped(
    tmp_path: pathlib.Path,
) -> None:
    """The write of save k is held until batch k+1 has started (so save k+1 comes due while
    it is in flight): no second capture happens while a write is in flight, none is lost."""
    started = [threading.Event() for _ in range(6)]
    seen: list[tuple[int, int, int]] = []
    saver = CheckpointSaver(tmp_path, filename="ba{batch}.pt", save_interval="1ba")

    class Starts(Callback):
        @blocking
        def after_dataloader(self, state: Any, logger: Any) -> None:
            started[int(state.timer.batch)].set()

        @blocking
        def fit_end(self, state: Any, logger: Any) -> None:
            for event in started:  # the last save has no next batch
                event.set()

    def hold(timestamp: Any, path: pathlib.Path) -> None:
        batch = int(timestamp.batch)
        assert started[batch].wait(30)  # the next batch started: its save is due
        stats = saver.statistics()
        seen.append((batch, stats.saves, stats.written))

    saver.add_listener(hold)
    model = TinyModel()
    Trainer(model, make_loader(4), "1ep", device="cpu", callbacks=[Starts(), saver]).fit_sync()
    # at each completion, exactly that save had been captured: never two in flight
    assert seen == [(1, 1, 0), (2, 2, 1), (3, 3, 2), (4, 4, 3)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"ba{b}.pt" for b in (1, 2, 3, 4)]


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads /proc (Linux)")
def test_memory_stays_flat_over_repeated_saves(tmp_path: pathlib.Path) -> None:
    """30 saves of a 12 MiB state (parameters + Adam): RSS after the last within a
    generous bound of the 5th (a leaked copy a save would add 12 MiB each); the figure
    itself is the benchmark's (``benchmarks/suite/checkpoint.py``)."""
    rss: list[float] = []
    saver = CheckpointSaver(tmp_path, filename="ba{batch}.pt", save_interval="1ba",
                            num_checkpoints_to_keep=1)  # fmt: skip
    saver.add_listener(lambda timestamp, path: rss.append(_rss_mib()))
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024))  # 4 MiB of parameters
    data = [(torch.randn(2, 1024), torch.randn(2, 1024))] * 30
    Trainer(
        model,
        data,
        "1ep",
        optimizers=torch.optim.Adam(model.parameters()),
        loss_fn=torch.nn.functional.mse_loss,
        device="cpu",
        callbacks=[saver],
    ).fit_sync()
    assert len(rss) == 30
    assert rss[-1] - rss[4] < 3 * 12, rss  # 25 leaked copies would be +300 MiB
