"""The arms of ``users_callbacks``: one fit of the ``g10`` workload with the callbacks users
turn on, each arm in a fresh process (``python -m suite._users_callbacks_arms ARM JSON``).

The workload (``../shared/notes/callbacks-users-turn-on.md``): the suite's ``g10`` model,
batch 128, SGD lr 0.01, cross-entropy, one torch thread, ``batches`` in-memory batches,
one epoch. The callbacks: progress output every 10 batches (to stdout, which the runner
points at a file), the metrics of every batch to a JSON-lines file and to TensorBoard, the
learning rate and a windowed throughput (100 batches), and with ``ckpt`` a checkpoint every
50 batches. Each framework uses its own built-ins; the plain loop writes the same by hand.

The clock: from the first batch's fetch to the end of ``fit`` (its close included), the
training part; ``torch.utils.tensorboard`` is imported before it in every arm with I/O. The
arm writes ``{"seconds", "batches", "checksum"}`` as JSON to ``out`` (every arm must train
to the same parameters: the checksum).

Arms: ``floor`` (the plain loop, no I/O), ``inline`` (the plain loop doing the I/O itself,
after each step), ``trainbus``, ``lightning``, ``composer`` (each in its own interpreter:
the peers' from ``benchmarks/.venvs``).
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch
from harness import workload as wl

WINDOW = 100
PROGRESS_EVERY = 10
CKPT_EVERY = 50


def _checksum(model: torch.nn.Module) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def floor(w: wl.Workload, data: wl.TimedBatches, folder: Path, ckpt: bool) -> None:
    wl.plain_fit(w, data, w.optimizer())


def inline(w: wl.Workload, data: wl.TimedBatches, folder: Path, ckpt: bool) -> None:
    from torch.utils.tensorboard import SummaryWriter

    model, loss_fn, opt = w.model, w.loss_fn, w.optimizer()
    writer = SummaryWriter(str(folder / "tb"))
    times: deque[float] = deque(maxlen=WINDOW + 1)
    samples: deque[int] = deque(maxlen=WINDOW + 1)
    total = 0
    with open(folder / "metrics.jsonl", "w") as jsonl:
        for step, (x, y) in enumerate(data, start=1):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            value = loss.item()
            lr = opt.param_groups[0]["lr"]
            total += int(x.shape[0])
            times.append(time.perf_counter())
            samples.append(total)
            metrics = {"loss/train": value, "lr-SGD/group0": lr}
            if len(times) > WINDOW:  # a full window, as the monitors' throughput
                span = times[-1] - times[0]
                metrics["throughput/batches_per_sec"] = WINDOW / span
                metrics["throughput/samples_per_sec"] = (samples[-1] - samples[0]) / span
            metrics["wall_clock/train"] = times[-1] - (data.t_first or times[-1])
            jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
            for name, v in metrics.items():
                writer.add_scalar(name, v, step)
            if step % PROGRESS_EVERY == 0:
                print(f"epoch 1 batch {step}/{len(data)} loss {value:.4f}", flush=True)
            if ckpt and step % CKPT_EVERY == 0:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                            "batch": step}, folder / f"ep0-ba{step}.pt")
    writer.close()


def trainbus(w: wl.Workload, data: wl.TimedBatches, folder: Path, ckpt: bool,
             quiet: bool = False) -> None:
    from trainbus import Trainer
    from trainbus.callbacks import CheckpointSaver, LRMonitor, ProgressBar, SpeedMonitor
    from trainbus.loggers import JSONLinesLogger, TensorBoardLogger

    callbacks: list[Any] = [LRMonitor(), SpeedMonitor(window_size=WINDOW)]
    if ckpt:
        callbacks.append(CheckpointSaver(str(folder / "ckpt"), save_interval=f"{CKPT_EVERY}ba",
                                         num_checkpoints_to_keep=-1))
    loggers = [ProgressBar(interval=f"{PROGRESS_EVERY}ba"),
               JSONLinesLogger(str(folder / "metrics.jsonl")), TensorBoardLogger(str(folder / "tb"))]
    trainer = Trainer(w.model, data, "1ep", loss_fn=w.loss_fn, optimizers=w.optimizer(),
                      callbacks=callbacks, loggers=loggers, device="cpu",
                      **({"progress": False, "track_time": False} if quiet else {}))
    trainer.fit_sync()


def trainbus_quiet(w: wl.Workload, data: wl.TimedBatches, folder: Path, ckpt: bool) -> None:
    """trainbus without its default output and time account (the same callbacks)."""
    trainbus(w, data, folder, ckpt, quiet=True)


def lightning(w: wl.Workload, data: wl.TimedBatches, folder: Path, ckpt: bool) -> None:
    import logging
    import warnings

    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import (
        LearningRateMonitor,
        ModelCheckpoint,
        ThroughputMonitor,
        TQDMProgressBar,
    )
    from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger

    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = w.model

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = w.loss_fn(self.model(x), y)
            self.log("loss/train", loss, prog_bar=True)
            return loss

        def configure_optimizers(self) -> Any:
            return w.optimizer()

    callbacks: list[Any] = [
        TQDMProgressBar(refresh_rate=PROGRESS_EVERY), LearningRateMonitor("step"),
        ThroughputMonitor(batch_size_fn=lambda batch: batch[0].shape[0], window_size=WINDOW),
    ]
    if ckpt:
        callbacks.append(ModelCheckpoint(dirpath=folder / "ckpt", every_n_train_steps=CKPT_EVERY,
                                         save_top_k=-1))
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, log_every_n_steps=1, limit_val_batches=0,
        enable_model_summary=False, callbacks=callbacks, default_root_dir=folder,
        logger=[CSVLogger(folder / "csv"), TensorBoardLogger(folder / "tb")],
        enable_checkpointing=ckpt,
    )
    trainer.fit(Module(), train_dataloaders=data)


def composer(w: wl.Workload, data: wl.TimedBatches, folder: Path, ckpt: bool) -> Any:
    import warnings

    for op in ("nms", "qnms"):  # as harness/frameworks/composer_fw.py
        torch.library.define(f"torchvision::{op}",
                             "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    warnings.filterwarnings("ignore")
    from composer import Trainer
    from composer.callbacks import CheckpointSaver, LRMonitor, SpeedMonitor
    from composer.loggers import FileLogger, TensorboardLogger
    from composer.models import ComposerModel

    class Model(ComposerModel):
        def __init__(self) -> None:
            super().__init__()
            self.model = w.model

        def forward(self, batch: Any) -> torch.Tensor:
            return self.model(batch[0])

        def loss(self, outputs: Any, batch: Any) -> torch.Tensor:
            return w.loss_fn(outputs, batch[1])

        def get_metrics(self, is_train: bool = False) -> dict[str, Any]:
            return {}

    callbacks: list[Any] = [LRMonitor(), SpeedMonitor(window_size=WINDOW)]
    if ckpt:
        callbacks.append(CheckpointSaver(folder=str(folder / "ckpt"),
                                         save_interval=f"{CKPT_EVERY}ba"))
    trainer = Trainer(
        model=Model(), train_dataloader=data, max_duration="1ep", optimizers=w.optimizer(),
        callbacks=callbacks, progress_bar=True, log_to_console=False, device="cpu",
        loggers=[FileLogger(str(folder / "log.txt")), TensorboardLogger(str(folder / "tb"))],
        precision="fp32", device_train_microbatch_size=w.batches[0][0].shape[0],
        spin_dataloaders=False, auto_log_hparams=False, seed=0,
    )
    trainer.fit()
    trainer.close()  # its loggers flush at close: inside the clock, as the others' do


ARMS = {"floor": floor, "inline": inline, "trainbus": trainbus,
        "trainbus-quiet": trainbus_quiet, "lightning": lightning, "composer": composer}


def measure(arm: str, batches: int, ckpt: bool, folder: str, out: str) -> None:
    w = wl.make_workload("g10", batches)
    if arm != "floor":
        import torch.utils.tensorboard  # noqa: F401  (before the clock, in every arm with I/O)
    data = wl.TimedBatches(w.batches)
    ARMS[arm](w, data, Path(folder), ckpt)
    end = time.perf_counter()
    assert data.t_first is not None
    Path(out).write_text(json.dumps({"seconds": end - data.t_first, "batches": batches,
                                     "checksum": _checksum(w.model)}))


if __name__ == "__main__":
    measure(sys.argv[1], **json.loads(sys.argv[2]))
