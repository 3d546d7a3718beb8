"""One rank of a small DDP run, for ``tests/test_distributed.py`` and ``gpu_check.py --ddp``.

Launch it with ``python -m torch.distributed.run --standalone --nproc_per_node=2``
``tests/distributed_scripts/ddp_train.py OUT --mode train``. Each rank writes
``OUT/rank<r>.json``: the sample ids it trained on, its final parameters and its eval
metrics. ``--mode train`` also logs to ``OUT/metrics-rank<r>.jsonl`` and saves a
checkpoint per epoch in ``OUT/ckpt`` (both rank-zero-only); ``--mode resume --load
PATH`` resumes from a checkpoint; ``--mode fail`` raises on rank 1 at batch 2 (and rank
0's recorder closes only once torchrun has sent it SIGTERM). ``--backend NAME`` initialises
the process group here (otherwise the Trainer does), e.g. ``gloo`` for two ranks on one GPU
(``--device cuda:0``); ``--wrap`` passes the model already wrapped in
``DistributedDataParallel`` (with one rank the Trainer would not wrap it). ``--wandb DIR``
and ``--tensorboard DIR`` add an offline ``WandBLogger`` and a ``TensorBoardLogger``
writing there (both rank-zero-only: one run for the job).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import trainbus
from trainbus import Callback, State, Trainer
from trainbus.callbacks import CheckpointSaver
from trainbus.loggers import JSONLinesLogger, TensorBoardLogger, WandBLogger


class Net(torch.nn.Module):
    """A linear regressor on batches ``(x, y, sample_id)``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, batch: Any) -> torch.Tensor:
        out: torch.Tensor = self.lin(batch[0]).squeeze(-1)
        return out

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return F.mse_loss(outputs, batch[1])


class Recorder(Callback):
    """Records the sample ids this rank trained on; writes them at close.

    With ``wait_for_sigterm`` its close first waits (up to 30 s) until the process got
    SIGTERM, which trainbus turns into ``state.stop_requested``: torchrun sends it once
    another worker has exited, so this close is still running when that happens.
    """

    def __init__(self, path: Path, *, wait_for_sigterm: bool = False) -> None:
        self.path = path
        self.wait_for_sigterm = wait_for_sigterm
        self.seen: list[list[int]] = []

    def epoch_start(self, state: State, logger: trainbus.Logger) -> None:
        self.seen.append([])

    def batch_end(self, state: State, logger: trainbus.Logger) -> None:
        if not self.seen:  # resumed inside an epoch: no EPOCH_START
            self.seen.append([])
        self.seen[-1].extend(int(i) for i in state.batch[2])

    def close(self, state: State, logger: trainbus.Logger) -> None:
        if self.wait_for_sigterm:
            state._stop.wait(timeout=30)  # set by trainbus's SIGTERM handler
        params = {k: v.tolist() for k, v in state.model.state_dict().items()}
        evals = {k: float(v) for k, v in state.current_metrics.get("eval", {}).items()}
        self.path.write_text(json.dumps({
            "rank": state.rank, "world_size": state.world_size, "local_rank": state.local_rank,
            "device": str(state.device), "seen": self.seen, "params": params, "eval": evals,
            "ddp": type(state.ddp_model).__name__, "batch": int(state.timer.batch),
            "sigterm": state.stop_requested,
            "preemption": None if state.preemption is None else state.preemption.reason,
            "closed_at": time.time(),
        }))  # fmt: skip


@trainbus.rank_zero_only
class Marker(Callback):
    """A user's rank-zero-only callback: leaves a file named after the rank it ran on."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def fit_start(self, state: State, logger: trainbus.Logger) -> None:
        (self.out / f"marker-rank{state.rank}").write_text("ran")


class Boom(Callback):
    """Raises on rank 1 at batch 2."""

    def batch_end(self, state: State, logger: trainbus.Logger) -> None:
        if state.rank == 1 and int(state.timer.batch) == 2:
            raise RuntimeError("boom on rank 1 at batch 2")


class StopOnRank1(Callback):
    """A stopper on a rank-local value: fires on rank 1 only, at batch 3."""

    def batch_end(self, state: State, logger: trainbus.Logger) -> None:
        if state.rank == 1 and int(state.timer.batch) == 3:
            state.stop_training()


class Cue(Callback):
    """Writes OUT/cue-rank<r> (the pid) at batch 2; slows batches so the signal lands."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def batch_end(self, state: State, logger: trainbus.Logger) -> None:
        time.sleep(0.1)
        if int(state.timer.batch) == 2 and state.preemption is None:
            (self.out / f"cue-rank{state.rank}").write_text(str(os.getpid()))


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(8, generator=g)
    return TensorDataset(x, y, torch.arange(8))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--mode", choices=["train", "resume", "fail", "stop", "preempt", "full3", "resume3"],
        default="train",
    )
    parser.add_argument("--load", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default=None)
    parser.add_argument("--wrap", action="store_true")
    parser.add_argument("--wandb", type=Path, default=None)
    parser.add_argument("--tensorboard", type=Path, default=None)
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ["RANK"])
    if args.backend is not None:
        if args.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(args.device))
        torch.distributed.init_process_group(args.backend)
    torch.manual_seed(1234 + rank)  # different initial weights: DDP must broadcast rank 0's
    model = Net()
    trained: torch.nn.Module = model
    if args.wrap:
        from torch.nn.parallel import DistributedDataParallel

        device = torch.device(args.device)
        ids = [device.index] if device.type == "cuda" else None
        trained = DistributedDataParallel(model.to(device), device_ids=ids)
    wait = args.mode == "fail" and rank == 0
    recorder = Recorder(out / f"rank{rank}.json", wait_for_sigterm=wait)
    callbacks: list[Callback] = [recorder, Marker(out)]
    loggers: list[trainbus.LoggerDestination] = []
    if args.mode == "train":
        callbacks.append(CheckpointSaver(out / "ckpt", save_interval="1ep"))
        loggers.append(JSONLinesLogger(out / f"metrics-rank{rank}.jsonl"))
    if args.mode == "fail":
        callbacks.append(Boom())
    if args.mode == "stop":
        callbacks += [StopOnRank1(), CheckpointSaver(out / "ckpt", "ba{batch}.pt", "1ba")]
    if args.mode == "preempt":
        callbacks += [Cue(out), CheckpointSaver(out / "ckpt", "ba{batch}.pt", "100ba")]
    duration = {"fail": "1000ep", "stop": "1000ep"}.get(args.mode, "2ep")
    if args.mode in ("preempt", "full3", "resume3"):
        duration = "3ep"
    if args.wandb is not None:
        loggers.append(WandBLogger("ddp", dir=args.wandb, mode="offline"))
    if args.tensorboard is not None:
        loggers.append(TensorBoardLogger(args.tensorboard))
    dataset = data()
    trainer = Trainer(
        trained,
        DataLoader(dataset, batch_size=1, shuffle=True),
        duration,
        eval_dataloader=DataLoader(dataset, batch_size=2),
        optimizers=torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=callbacks,
        loggers=loggers,
        device=args.device,
        seed=7,
        load_path=args.load,
        dist_timeout=30.0,
    )
    try:
        trainer.fit_sync()
    except SystemExit as exc:  # TrainingPreempted: its status, before the process ends
        (out / f"exit-rank{rank}").write_text(str(exc.code))
        raise


if __name__ == "__main__":
    main()
