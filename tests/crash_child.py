"""The training process that ``tests/test_crash_consistency.py`` kills and resumes.

``python tests/crash_child.py WORKDIR URL EVERY [--preemption] [--default-journal]
[--mlflow URI EXPERIMENT] [--tensorboard] [--wandb] [--attempts] [--pause-at N]
[--load-oldest]``: 3 epochs
x 20 batches of a model whose forward takes ~50 ms, shuffled data, an eval pass per epoch,
a checkpoint every ``EVERY`` batches in ``WORKDIR/ckpt`` (resumed from there when it holds one), an
``HTTPMetricsUploader`` with a journal in ``WORKDIR/spool`` posting to ``URL`` (``journal=True``,
or with ``--default-journal`` the default: a journal because the run has a saver), and a
``JSONLinesLogger`` writing ``WORKDIR/metrics.jsonl``. After each batch's checkpoint event
it prints ``batch <n> saved <checkpoints written>`` (from the training thread, so the run
is at that point when the line is written). A finished run saves its weights to
``WORKDIR/final.pt`` and prints ``done``.

The options of issue 41: ``--tensorboard`` adds a ``TensorBoardLogger`` (``WORKDIR/tb``),
``--wandb`` a ``WandBLogger`` (offline, ``WORKDIR/wb``, W&B's default settings; the
parent sets the W&B environment); ``--attempts`` adds ``1000 x`` the number of earlier
starts in ``WORKDIR`` to the ``half`` metric (a non-deterministic value: it tells which run
logged a point);
``--pause-at N`` holds the training thread 1 s at batch ``N``'s checkpoint event before it
reports it (the writers' flush intervals pass, as they would in a kill that comes later);
``--load-oldest`` resumes from the oldest checkpoint instead of the newest.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from trainbus import Callback, Preemption, Trainer, blocking
from trainbus.callbacks import CheckpointSaver
from trainbus.loggers import (
    HTTPMetricsUploader,
    JSONLinesLogger,
    MLflowLogger,
    TensorBoardLogger,
    WandBLogger,
)

BATCHES, EPOCHS, DELAY = 20, 3, 0.05


class SlowModel(torch.nn.Module):
    """A linear classifier whose forward takes ``DELAY`` seconds (as a bigger model would)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, batch: Any) -> torch.Tensor:
        x, _ = batch
        time.sleep(DELAY)
        out: torch.Tensor = self.lin(x)
        return out

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(outputs, batch[1])


class Progress(Callback):
    """Logs two metrics per batch and reports progress on stdout (training thread)."""

    def __init__(self, saver: CheckpointSaver, offset: float = 0.0, pause_at: int = -1) -> None:
        self.saver = saver
        self.offset = offset
        self.pause_at = pause_at

    @blocking
    def batch_end(self, state: Any, logger: Any) -> None:
        batch = int(state.timer.batch)
        norm = float(state.model.lin.weight.detach().norm())
        logger.log_metrics({"weight/norm": norm, "half": batch * 0.5 + self.offset})

    @blocking
    def batch_checkpoint(self, state: Any, logger: Any) -> None:
        written = len(self.saver.saved_checkpoints)
        if int(state.timer.batch) == self.pause_at:
            time.sleep(1.0)
        print(f"batch {int(state.timer.batch)} saved {written}", flush=True)


def main(argv: list[str]) -> None:
    workdir, url, every = Path(argv[0]), argv[1], int(argv[2])
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCHES * 4, 8, generator=g)
    y = torch.randint(0, 4, (BATCHES * 4,), generator=g)
    ex, ey = torch.randn(8, 8, generator=g), torch.randint(0, 4, (8,), generator=g)
    loader = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)
    model = SlowModel()
    saver = CheckpointSaver(workdir / "ckpt", save_interval=f"{every}ba", overwrite=True)
    journal = {} if "--default-journal" in argv else {"journal": True}  # the default: None
    uploader = HTTPMetricsUploader(
        url, spool_dir=workdir / "spool", batch_size=8, flush_seconds=0.2,
        backoff=0.01, max_backoff=0.05, **journal,
    )  # fmt: skip
    loggers: list[Any] = [uploader, JSONLinesLogger(workdir / "metrics.jsonl", flush_seconds=0.5)]
    if "--mlflow" in argv:  # --mlflow URI EXPERIMENT: an MLflowLogger too (journal by default)
        uri, experiment = argv[argv.index("--mlflow") + 1 : argv.index("--mlflow") + 3]
        loggers.append(MLflowLogger(
            uri, experiment_name=experiment, spool_dir=workdir / "mlflow-spool",
            flush_seconds=0.2, backoff=0.01, max_backoff=0.05,
        ))  # fmt: skip
    if "--tensorboard" in argv:
        loggers.append(TensorBoardLogger(workdir / "tb", flush_seconds=0.2))
    if "--wandb" in argv:
        loggers.append(WandBLogger("crash", dir=workdir / "wb", mode="offline"))  # defaults
    offset = 0.0
    if "--attempts" in argv:  # 1000 x the number of earlier starts in this folder
        starts = workdir / "starts"
        offset = 1000.0 * len(starts.read_text()) if starts.exists() else 0.0
        with starts.open("a") as f:
            f.write("x")
    pause_at = int(argv[argv.index("--pause-at") + 1]) if "--pause-at" in argv else -1
    load: Path = workdir / "ckpt"
    if "--load-oldest" in argv and load.exists():
        load = min(load.glob("*.pt"), key=lambda p: int(p.name.split("-ba")[1].split("-")[0]))
    trainer = Trainer(
        model, loader, f"{EPOCHS}ep",
        eval_dataloader=DataLoader(TensorDataset(ex, ey), batch_size=4),
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        callbacks=[saver, Progress(saver, offset, pause_at)],
        loggers=loggers,
        run_name="crash", seed=0, load_path=load,
        preemption=Preemption(grace=10.0) if "--preemption" in argv else False,
    )  # fmt: skip
    trainer.fit_sync()
    torch.save(model.state_dict(), workdir / "final.pt")
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
