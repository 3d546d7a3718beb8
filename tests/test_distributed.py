"""Training under ``torchrun``: two real CPU processes (gloo), and the pieces in one process.

The two-process tests launch ``tests/distributed_scripts/ddp_train.py`` with
``python -m torch.distributed.run --standalone --nproc_per_node=2`` (each launch takes
about 10 s on two cores, hence ``slow``; they run by default).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import trainbus
from trainbus import Callback, Trainer
from trainbus.callbacks import CheckpointSaver, EventStream
from trainbus.loggers import (
    ConsoleLogger,
    HTTPMetricsUploader,
    InMemoryLogger,
    JSONLinesLogger,
    MLflowLogger,
    TensorBoardLogger,
    WandBLogger,
)
from trainbus.runtime.distributed import DistInfo, runs_here, shard_loader

from .helpers import TinyModel, make_loader

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "distributed_scripts" / "ddp_train.py"
LAST_COLLECTIVE = ROOT / "tests" / "distributed_scripts" / "last_collective.py"
LAUNCH_TIMEOUT = 120  # a hung launch fails the test instead of the whole suite


def _launch(out: Path, *args: str, script: Path = SCRIPT) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(script), str(out), *args,
    ]  # fmt: skip
    return subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, check=False
    )


def _ranks(out: Path) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp-train")
    proc = _launch(out, "--mode", "train")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


# -- two processes ------------------------------------------------------------------------


@pytest.mark.slow
def test_each_rank_trains_on_its_half_of_the_batches(trained: Path) -> None:
    ranks = _ranks(trained)
    assert [(r["rank"], r["world_size"], r["local_rank"]) for r in ranks] == [(0, 2, 0), (1, 2, 1)]
    for epoch in (0, 1):
        halves = [r["seen"][epoch] for r in ranks]
        assert [len(h) for h in halves] == [4, 4]  # 8 batches of one sample: 4 per rank
        assert sorted(halves[0] + halves[1]) == list(range(8))  # disjoint, all covered
    assert ranks[0]["seen"][0] != ranks[0]["seen"][1]  # set_epoch: a new order each epoch


@pytest.mark.slow
def test_parameters_and_eval_metrics_are_identical_across_ranks(trained: Path) -> None:
    r0, r1 = _ranks(trained)
    assert r0["ddp"] == r1["ddp"] == "DistributedDataParallel"
    assert r0["params"] == r1["params"]  # the script starts each rank from other weights
    # The eval loss is the mean over all 8 samples (each rank evaluated 4), on every rank.
    weight = torch.tensor(r0["params"]["lin.weight"])
    bias = torch.tensor(r0["params"]["lin.bias"])
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from ddp_train import data
    finally:
        sys.path.remove(str(SCRIPT.parent))
    x, y, _ = data().tensors
    expected = float(torch.nn.functional.mse_loss(x @ weight.T.squeeze(-1) + bias, y))
    assert r0["eval"]["loss"] == r1["eval"]["loss"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow
def test_only_rank_zero_writes_logs_checkpoints_and_runs_rank_zero_only_callbacks(
    trained: Path,
) -> None:
    assert (trained / "metrics-rank0.jsonl").stat().st_size > 0
    assert not (trained / "metrics-rank1.jsonl").exists()
    assert sorted(p.name for p in (trained / "ckpt").iterdir()) == [
        "ep1-ba4-rank0.pt",
        "ep2-ba8-rank0.pt",
    ]
    assert (trained / "marker-rank0").exists()
    assert not (trained / "marker-rank1").exists()
    # The checkpoint holds the user's module (no "module." prefix): it loads in one process.
    model = TinyModel(n_in=4, n_out=1)
    saved = torch.load(trained / "ckpt" / "ep2-ba8-rank0.pt", weights_only=False)["model"]
    assert sorted(saved) == ["lin.bias", "lin.weight"]
    model.lin.load_state_dict({k.removeprefix("lin."): v for k, v in saved.items()})


@pytest.mark.slow
def test_two_ranks_resume_from_a_rank_zero_checkpoint(trained: Path, tmp_path: Path) -> None:
    checkpoint = trained / "ckpt" / "ep1-ba4-rank0.pt"
    proc = _launch(tmp_path, "--mode", "resume", "--load", str(checkpoint))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    resumed, full = _ranks(tmp_path), _ranks(trained)
    for r_resumed, r_full in zip(resumed, full, strict=True):
        assert r_resumed["seen"] == [r_full["seen"][1]]  # epoch 2's half, in the same order
        assert r_resumed["batch"] == 8
        assert r_resumed["params"] == r_full["params"]  # as the uninterrupted run


@pytest.mark.slow
def test_two_ranks_make_one_wandb_run_and_one_tensorboard_folder_across_a_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both ranks build a ``WandBLogger`` (each with an id of its own) and a
    ``TensorBoardLogger``: only rank zero opens them, so the job makes one W&B run; the
    job resumed from the first epoch's checkpoint logs into that run and that folder,
    each step once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.loggers.wandb_files import offline_env, run_folders, wandb_history

    for key, value in offline_env(tmp_path / "wandb-home").items():
        monkeypatch.setenv(key, value)
    wb, tb = tmp_path / "wb", tmp_path / "tb"
    first = _launch(tmp_path / "a", "--wandb", str(wb), "--tensorboard", str(tb))
    assert first.returncode == 0, first.stdout + first.stderr
    checkpoint = tmp_path / "a" / "ckpt" / "ep1-ba4-rank0.pt"
    again = _launch(
        tmp_path / "b", "--mode", "resume", "--load", str(checkpoint),
        "--wandb", str(wb), "--tensorboard", str(tmp_path / "tb-new"),
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(run_folders(wb)) == 2  # the first job's and the resumed job's rank zero
    history = wandb_history(wb)
    assert len(history) == 1, list(history)  # one run id
    (rows,) = history.values()
    assert [step for step, items in rows if "loss/train" in items] == list(range(1, 9))
    assert not (tmp_path / "tb-new").exists()  # the resumed job wrote into the run's folder
    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss/train")] == list(range(1, 9))


@pytest.mark.slow
def test_an_exception_on_rank_1_stops_both_ranks(tmp_path: Path) -> None:
    proc = _launch(tmp_path, "--mode", "fail")  # the script trains for 1000 epochs
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "RuntimeError: boom on rank 1 at batch 2" in output
    # A safety bound (no rank left waiting for dist_timeout=30 s), not a timing claim:
    # both ranks closed together (a launch alone takes 10-30 s on the shared machine).
    r0, r1 = _ranks(tmp_path)
    assert abs(r0["closed_at"] - r1["closed_at"]) < 15, output
    # Each rank ran its callbacks' close (the recorder writes its file there), and both
    # stopped at the same batch (issue 40): rank 1 held its error and went on computing
    # until the ranks agreed, one boundary later; rank 0 says why it stopped.
    r0, r1 = _ranks(tmp_path)
    assert (r0["rank"], r1["rank"]) == (0, 1)
    assert r0["sigterm"] and r1["sigterm"]  # the agreed stop, on both
    assert r0["batch"] == r1["batch"], output
    assert re.search(r"RuntimeError: fit\(\) stopped on rank 0 after batch \d+: another", output)
    # torchrun's summary lists both workers as failed (exit 1, or SIGTERM if it got there first).
    for rank in (0, 1):
        assert re.search(rf"rank\s*: {rank} \(local_rank: {rank}\)", output), output


@pytest.mark.slow
@pytest.mark.parametrize("init", ["", "--init"], ids=["trainer-inits", "script-inits"])
def test_a_collective_that_ends_just_before_exit_does_not_abort_the_rank(
    tmp_path: Path, init: str
) -> None:
    # Issue 16 (pytorch/pytorch#190489): the gloo worker thread's release of the last
    # gather ran into Python's finalization: SIGABRT, "terminate called without an active
    # exception". The script sets the race up; without trainbus.runtime.gloo_exit about half the
    # launches aborted.
    proc = _launch(tmp_path, *filter(None, [init]), script=LAST_COLLECTIVE)
    assert "terminate called" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- one process ----------------------------------------------------------------------------


def test_the_gloo_exit_handler_is_installed_once_per_process() -> None:
    import atexit

    from trainbus.runtime import gloo_exit as _gloo_exit

    already, count = _gloo_exit.registered(), atexit._ncallbacks()
    _gloo_exit.register()
    _gloo_exit.register()
    added = atexit._ncallbacks() - count
    if sys.version_info >= (3, 14):  # CPython 3.14 parks such threads: nothing to avoid
        assert (added, _gloo_exit.registered()) == (0, False)
    else:
        assert (added, _gloo_exit.registered()) == (0 if already else 1, True)


def test_a_single_process_is_rank_zero_of_one() -> None:
    model, loader = TinyModel(), make_loader(2)
    trainer = Trainer(model, loader, "1ep", device="cpu")
    state = trainer.state
    assert (state.rank, state.world_size, state.local_rank) == (0, 1, 0)
    assert state.ddp_model is model
    assert state.train_dataloader is loader  # not sharded


@pytest.mark.parametrize("timeout", [0, -1.0, "300", True])
def test_dist_timeout_must_be_positive_seconds(timeout: Any) -> None:
    with pytest.raises(ValueError, match=r"dist_timeout=.* must be a positive number of seconds"):
        Trainer(TinyModel(), make_loader(2), "1ep", device="cpu", dist_timeout=timeout)


def test_file_and_network_loggers_stream_and_saver_are_rank_zero_only() -> None:
    for cls in (
        JSONLinesLogger, ConsoleLogger, TensorBoardLogger, HTTPMetricsUploader, MLflowLogger,
        WandBLogger, EventStream, CheckpointSaver,
    ):  # fmt: skip
        assert cls.rank_zero_only is True, cls
    assert Callback.rank_zero_only is False
    assert InMemoryLogger.rank_zero_only is False


def test_rank_zero_only_decorator_and_instance_override() -> None:
    @trainbus.rank_zero_only
    class Upload(Callback):
        pass

    rank1 = DistInfo(rank=1, world_size=2, local_rank=1)
    assert Upload.rank_zero_only is True
    assert not runs_here(Upload(), rank1)
    assert runs_here(Upload(), DistInfo(rank=0, world_size=2))
    assert runs_here(Callback(), rank1)
    everywhere = Upload()
    everywhere.rank_zero_only = False  # this instance acts on every rank
    assert runs_here(everywhere, rank1)


def test_rank_zero_only_refuses_what_is_not_a_callback_class() -> None:
    with pytest.raises(TypeError, match=r"decorates Callback subclasses.*rank_zero_only = True"):
        trainbus.rank_zero_only(Callback())  # type: ignore[type-var]
    with pytest.raises(TypeError, match="decorates Callback subclasses"):
        trainbus.rank_zero_only(int)


def test_a_plain_dataloader_is_rebuilt_with_a_distributed_sampler() -> None:
    dataset = TensorDataset(torch.arange(10.0), torch.arange(10))

    def collate(items: list[Any]) -> Any:
        return torch.utils.data.default_collate(items)

    loader = DataLoader(dataset, batch_size=2, shuffle=True, drop_last=True, collate_fn=collate)
    sharded = shard_loader(loader, DistInfo(rank=1, world_size=2), name="train_dataloader", seed=3)
    sampler = sharded.sampler
    assert isinstance(sampler, DistributedSampler)
    assert (sampler.rank, sampler.num_replicas, sampler.shuffle, sampler.seed) == (1, 2, True, 3)
    assert (sharded.batch_size, sharded.drop_last, sharded.collate_fn) == (2, True, collate)
    assert len(sharded) == 2  # 5 samples on this rank, batches of 2, the last one dropped
    sequential = shard_loader(
        DataLoader(dataset, batch_size=5), DistInfo(rank=0, world_size=2), name="e", seed=0
    )
    assert [b[1].tolist() for b in sequential] == [[0, 2, 4, 6, 8]]  # no shuffling
    assert shard_loader(sharded, DistInfo(rank=1, world_size=2), name="x", seed=0) is sharded
    assert shard_loader(loader, DistInfo(), name="x", seed=0) is loader  # one process


def test_a_loader_that_cannot_be_sharded_warns_that_every_rank_reads_all_of_it() -> None:
    batches = [(torch.zeros(1, 4), torch.zeros(1, dtype=torch.long))]
    with pytest.warns(trainbus.TrainbusWarning, match=r"train_dataloader \(list\) cannot be"):
        kept = shard_loader(batches, DistInfo(world_size=2), name="train_dataloader", seed=0)
    assert kept is batches


FSDP_WITH_UPLOADER = """
import os, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from trainbus import Trainer
from trainbus.callbacks import CheckpointSaver, CheckpointUploader
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group("gloo", rank=0, world_size=1)
model = fully_shard(torch.nn.Linear(4, 2))
batches = [(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long))]
saver = CheckpointSaver("ckpt")
uploader = CheckpointUploader(saver, "s3://bucket/run", endpoint_url="http://127.0.0.1:9",
                              region="us-east-1", access_key_id="k", secret_access_key="s")
try:
    Trainer(model, batches, "1ep", loss_fn=torch.nn.functional.cross_entropy, device="cpu",
            callbacks=[saver, uploader])
except ValueError as exc:
    print(exc)
print("saver alone:", type(Trainer(model, batches, "1ep", device="cpu", callbacks=[saver],
      loss_fn=torch.nn.functional.cross_entropy).state.ddp_model).__name__)
"""


def test_a_checkpoint_uploader_with_an_fsdp_model_is_refused(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:  # a free port for this one-process group
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", PORT=str(port))
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", FSDP_WITH_UPLOADER],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT,
        check=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert "callbacks=[CheckpointUploader(...)] cannot upload an FSDP model's" in out, out
    assert "saver alone: FSDPLinear" in proc.stdout, out  # a saver is fine, and no DDP wrap


# -- every rank stops at the same batch (issue 40) ------------------------------------------


@pytest.mark.slow
def test_a_stopper_on_rank_1_only_ends_both_ranks_at_the_same_batch(tmp_path: Path) -> None:
    proc = _launch(tmp_path, "--mode", "stop")  # 1000 epochs, unless both stop
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r0, r1 = _ranks(tmp_path)
    # A safety bound (no rank left waiting for dist_timeout=30 s), not a timing claim.
    assert abs(r0["closed_at"] - r1["closed_at"]) < 15, proc.stderr
    # Rank 1 asked after batch 3; the ranks agree one boundary later, together.
    assert r0["batch"] == r1["batch"] == 4
    assert r0["params"] == r1["params"]
    newest = max(int(p.stem.removeprefix("ba")) for p in (tmp_path / "ckpt").iterdir())
    assert newest == 4  # the rank-zero checkpoint describes that batch


@pytest.mark.slow
def test_sigterm_to_rank_1_only_stops_both_ranks_with_one_checkpoint_that_resumes_exactly(
    tmp_path: Path,
) -> None:
    import signal
    import threading

    out, reference, resumed = tmp_path / "preempt", tmp_path / "full", tmp_path / "resumed"
    out.mkdir()
    box: list[subprocess.CompletedProcess[str]] = []
    launcher = threading.Thread(target=lambda: box.append(_launch(out, "--mode", "preempt")))
    launcher.start()
    cue = out / "cue-rank1"
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    while not cue.exists() and time.monotonic() < deadline and launcher.is_alive():
        time.sleep(0.05)  # rank 1 writes its pid at batch 2
    assert cue.exists(), box
    time.sleep(0.1)  # let the file's write finish
    os.kill(int(cue.read_text()), signal.SIGTERM)  # rank 1 only, not through torchrun
    launcher.join(LAUNCH_TIMEOUT)
    [proc] = box
    output = proc.stdout + proc.stderr
    r0, r1 = _ranks(out)
    assert r0["batch"] == r1["batch"], output  # the same batch on both ranks
    assert 2 <= r0["batch"] < 12, output
    assert (r0["preemption"], r1["preemption"]) == ("SIGTERM on another rank", "SIGTERM")
    assert sorted(p.name for p in (out / "ckpt").iterdir()) == [f"ba{r0['batch']}.pt"]
    # Each rank's fit_sync() raised TrainingPreempted(143); torchrun saw 143 from the first
    # to exit (the other may get torchrun's SIGTERM while its interpreter ends).
    assert [(out / f"exit-rank{r}").read_text() for r in (0, 1)] == ["143", "143"]
    assert re.search(r"exitcode\s*: 143", output), output

    done = _launch(reference, "--mode", "full3")
    assert done.returncode == 0, done.stdout + done.stderr
    again = _launch(resumed, "--mode", "resume3", "--load", str(out / "ckpt"))
    assert again.returncode == 0, again.stdout + again.stderr
    for got, want in zip(_ranks(resumed), _ranks(reference), strict=True):
        assert got["batch"] == want["batch"] == 12
        assert got["params"] == want["params"]  # as the uninterrupted run
