"""FSDP checkpoints with ``torch.distributed.checkpoint``: two real CPU processes, and one.

The two-process tests launch ``tests/distributed_scripts/fsdp_train.py`` with
``python -m torch.distributed.run --standalone --nproc_per_node=2`` (gloo, ``fully_shard``;
each launch takes 10-20 s on two cores, hence ``slow``: run them with ``-m slow``). The
one-process tests check finding and refusing sharded checkpoints, and that a sharded
checkpoint resumes a run in a single process too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from trainbus import CheckpointLoadError, CheckpointWarning, Trainer
from trainbus.callbacks import CheckpointSaver
from trainbus.checkpoint.resume import find_checkpoint
from trainbus.checkpoint.sharded import folder_name, is_interrupted
from trainbus.checkpoint.sharded import save as sharded_save
from trainbus.core.timer import Timestamp

from .helpers import TinyModel, make_loader

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "distributed_scripts" / "fsdp_train.py"
LAUNCH_TIMEOUT = 120  # a hung launch fails the test instead of the whole suite
SKIPPED = "has no .metadata: its save was interrupted; it is skipped"


def _launch(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(SCRIPT), str(out), *args,
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _ranks(out: Path) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def _assert_same_end(resumed: Path, full: Path) -> None:
    for r_resumed, r_full in zip(_ranks(resumed), _ranks(full), strict=True):
        assert r_resumed["batch"] == r_full["batch"] == 8
        assert r_resumed["model"] == r_full["model"]  # the full state dicts, bit for bit
        assert r_resumed["optim"] == r_full["optim"]  # Adam's moments and steps
        assert r_resumed["lr"] == r_full["lr"]  # the scheduler's state
        assert r_resumed["seen"] == r_full["seen"]  # per-rank callback state and data order


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fsdp-train")
    _launch(out, "--mode", "train")
    return out


# -- two processes ------------------------------------------------------------------------


@pytest.mark.slow
def test_an_fsdp_run_saves_dcp_folders_written_by_both_ranks(trained: Path) -> None:
    r0, r1 = _ranks(trained)
    assert r0["wrapper"] == r1["wrapper"] == "FSDPNet"  # fully_shard's class: not wrapped in DDP
    assert r0["model"] == r1["model"]
    for epoch in (0, 1):  # each rank trained on its own half
        assert sorted(r0["seen"][epoch] + r1["seen"][epoch]) == list(range(8))
    ckpt = trained / "ckpt"
    # Saved every 2 batches, 3 kept: ep0-ba2 was pruned (by rank zero, the shared folder).
    assert sorted(p.name for p in ckpt.iterdir()) == ["ep0-ba4", "ep1-ba6", "ep1-ba8"]
    for folder in ckpt.iterdir():
        files = sorted(p.name for p in folder.iterdir())
        assert files == [  # one shard file per rank, each with its checksum
            ".metadata", ".metadata.crc32", "__0_0.distcp", "__0_0.distcp.crc32",
            "__1_0.distcp", "__1_0.distcp.crc32",
        ]  # fmt: skip
    # Both ranks ran their saver (it is rank-zero-only with DDP, not with FSDP).
    expected = [[b, str(ckpt / n)] for b, n in ((4, "ep0-ba4"), (6, "ep1-ba6"), (8, "ep1-ba8"))]
    assert r0["saved"] == r1["saved"] == expected
    for r in (r0, r1):  # 4 saves on each rank, each staged (its shards) and written
        assert (r["stats"]["saves"], r["stats"]["written"]) == (4, 4)
        assert r["stats"]["host_bytes"] > 0


@pytest.mark.slow
def test_the_saver_destroys_its_process_group_at_close_and_the_exit_handler_is_on(
    trained: Path,
) -> None:
    for r in _ranks(trained):  # the run launched exited 0 (it gathers right before its exit)
        assert r["groups_after_fit"] == 1  # the default group; DCP's and the agreement's gone
        assert r["exit_handler"]  # gloo: trainbus.runtime.gloo_exit's atexit handler is installed


@pytest.mark.slow
def test_two_ranks_resume_from_a_dcp_checkpoint_as_if_uninterrupted(
    trained: Path, tmp_path: Path
) -> None:
    _launch(tmp_path, "--mode", "resume", "--load", str(trained / "ckpt" / "ep1-ba6"))
    _assert_same_end(tmp_path, trained)  # resumed mid-epoch 2, at batch 6 of 8


@pytest.mark.slow
def test_an_interrupted_save_is_skipped_on_resume_with_a_warning(
    trained: Path, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(trained / "ckpt", ckpt)
    (ckpt / "ep1-ba8" / ".metadata").unlink()  # the last save never committed
    proc = _launch(tmp_path / "out", "--mode", "resume", "--load", str(ckpt), "--ckpt", str(ckpt))
    assert proc.stderr.count(f"{str(ckpt / 'ep1-ba8')!r} {SKIPPED}") == 2  # on each rank
    _assert_same_end(tmp_path / "out", trained)  # resumed from ep1-ba6, the newest complete
    assert (ckpt / "ep1-ba8" / ".metadata").is_file()  # the interrupted folder was rewritten


@pytest.mark.slow
def test_a_damaged_shard_is_skipped_on_resume_with_a_warning(trained: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(trained / "ckpt", ckpt)
    shard = ckpt / "ep1-ba8" / "__1_0.distcp"  # rank one's shard of the newest checkpoint
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit
    shard.write_bytes(bytes(data))
    with pytest.raises(AssertionError, match=r"'__1_0\.distcp' fails its CRC-32 check"):
        _launch(tmp_path / "direct", "--mode", "resume", "--load", str(ckpt / "ep1-ba8"))
    # (the resumed run saves elsewhere: the damaged ep1-ba8 is kept, not overwritten)
    proc = _launch(tmp_path / "out", "--mode", "resume", "--load", str(ckpt))
    damaged = f"{str(ckpt / 'ep1-ba8')!r} is damaged"
    assert proc.stderr.count(damaged) == 2, proc.stderr  # the same decision on each rank
    _assert_same_end(tmp_path / "out", trained)  # resumed from ep1-ba6, the newest intact


@pytest.mark.slow
def test_fsdp1_saves_and_resumes_too(tmp_path: Path) -> None:
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    _launch(full, "--mode", "train", "--fsdp1")
    assert _ranks(full)[0]["wrapper"] == "FullyShardedDataParallel"
    assert (full / "ckpt" / "ep1-ba6" / ".metadata").is_file()
    _launch(resumed, "--mode", "resume", "--fsdp1", "--load", str(full / "ckpt" / "ep1-ba6"))
    _assert_same_end(resumed, full)


# -- one process ----------------------------------------------------------------------------


def _trainer(duration: str = "2ep", **kw: Any) -> Trainer:
    model = TinyModel()
    return Trainer(
        model, make_loader(4), duration, optimizers=torch.optim.Adam(model.parameters()),
        device="cpu", seed=3, **kw,
    )  # fmt: skip


def _sharded_checkpoint(trainer: Trainer, path: Path) -> None:
    """What an FSDP run's saver writes, from a plain model in one process (no group)."""
    sharded_save(trainer.state, path, weights_only=False, epoch_rng=None, group=None).write(path)


def _plain_dcp(path: Path) -> None:
    """A torch.distributed.checkpoint that trainbus did not write."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp_save({"w": torch.zeros(2)}, storage_writer=FileSystemWriter(str(path)), no_dist=True)


def test_the_folder_of_a_sharded_checkpoint_drops_rank_and_suffix() -> None:
    ts = Timestamp(epoch=1, batch=4)
    assert folder_name("ep{epoch}-ba{batch}-rank{rank}.pt", ts) == "ep1-ba4"
    assert folder_name("run/{batch}_rank{rank}", ts) == "run/4"
    assert folder_name("step{batch}.pt", ts) == "step4"


def test_the_newest_complete_checkpoint_is_found_and_an_interrupted_one_skipped(
    tmp_path: Path,
) -> None:
    older = tmp_path / "ep1-ba4"
    _plain_dcp(older)
    newer = tmp_path / "ep2-ba8"
    _plain_dcp(newer)
    os.utime(older / ".metadata", ns=(1, 1))  # the .metadata's time orders sharded checkpoints
    assert find_checkpoint(tmp_path) == newer
    (newer / ".metadata").unlink()  # as if that save had been interrupted
    assert is_interrupted(newer)
    with pytest.warns(CheckpointWarning, match=rf"{newer.name}'? {SKIPPED}"):
        assert find_checkpoint(tmp_path) == older


def test_load_path_refuses_an_interrupted_folder_and_a_foreign_dcp(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    _plain_dcp(foreign)
    with pytest.raises(CheckpointLoadError, match="without trainbus's trainer state"):
        _trainer(load_path=foreign)
    (foreign / ".metadata").unlink()
    with pytest.raises(CheckpointLoadError, match=r"has no \.metadata: its save was interrupted"):
        _trainer(load_path=foreign)


def test_a_sharded_checkpoint_resumes_a_plain_model_in_one_process(tmp_path: Path) -> None:
    full = _trainer("1ep")
    full.fit_sync()
    _sharded_checkpoint(full, tmp_path / "ep1-ba4")
    full.fit_sync(duration="1ep")  # the second epoch
    other = TinyModel(n_in=5)  # another model: refused with the names and shapes
    with pytest.raises(CheckpointLoadError, match=r"lin.weight: checkpoint \(3, 4\) vs model"):
        Trainer(other, make_loader(4, n_in=5), "2ep", device="cpu", load_path=tmp_path)
    resumed = _trainer(load_path=tmp_path)
    assert int(resumed.state.timer.batch) == 4
    resumed.fit_sync()
    assert int(resumed.state.timer.batch) == int(full.state.timer.batch) == 8
    done, again = full.state.model.state_dict(), resumed.state.model.state_dict()
    assert all(torch.equal(done[k], again[k]) for k in done)


def test_a_saver_folder_name_records_its_sharded_checkpoints(tmp_path: Path) -> None:
    saver = CheckpointSaver(tmp_path)
    _plain_dcp(tmp_path / "ep1-ba4")
    saver.load_state_dict({"saved": [[{"epoch": 1, "batch": 4}, "ep1-ba4"], [{}, "gone"]]})
    assert [p for _, p in saver.saved_checkpoints] == [[tmp_path / "ep1-ba4"]]
