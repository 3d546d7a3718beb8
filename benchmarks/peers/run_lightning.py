"""PyTorch Lightning: per-batch overhead of its Trainer and of its Callback hooks.

A LightningModule whose training_step returns the cross-entropy loss (automatic
optimization, SGD) fits one epoch over the 200 in-memory batches per repetition,
a fresh Trainer each time, in ``barebones=True`` mode: no logger, checkpointing,
progress bar, model summary, sanity check or profiler; no validation data.
No-op callbacks override every per-batch Callback hook (on_train_batch_start,
on_before_backward, on_after_backward, on_before_optimizer_step,
on_before_zero_grad, on_train_batch_end: 6 calls per batch each); the sleep
and upload callbacks use on_train_batch_end. Run in its venv:

    benchmarks/.venvs/lightning/bin/python benchmarks/peers/run_lightning.py --scenario a
    benchmarks/.venvs/lightning/bin/python benchmarks/peers/run_lightning.py --serve  # a worker
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytorch_lightning as pl
import workloads as wl

PER_BATCH_HOOKS = (
    "on_train_batch_start", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad", "on_train_batch_end",
)


class NoOp(pl.Callback):
    pass


for _hook in PER_BATCH_HOOKS:
    setattr(NoOp, _hook, lambda self, *args, **kwargs: None)


class Sleeper(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        wl.sleep_5ms()


class Uploader(pl.Callback):
    def __init__(self, url: str) -> None:
        self.url = url

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        wl.post_metrics(self.url, trainer.global_step, outputs["loss"].item())


class Module(pl.LightningModule):
    def __init__(self, w: wl.Workload) -> None:
        super().__init__()
        self.w = w
        self.model = w.model

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.w.loss_fn(self.model(x), y)

    def configure_optimizers(self):
        return self.w.optimizer()


def bench(w: wl.Workload, spec: wl.Scenario, url: str | None, reps: int,
          warmup: int) -> tuple[list[float], list[float], int]:
    """Lightning in ``spec`` (see workloads.Bench)."""
    module = Module(w)
    factory = {"noop": NoOp, "sleep": Sleeper, "upload": lambda: Uploader(url)}[spec.action]

    def fit_epoch(data: wl.TimedBatches) -> None:
        trainer = pl.Trainer(
            accelerator="cpu", devices=1, max_epochs=1, barebones=True,
            limit_val_batches=0, callbacks=[factory() for _ in range(spec.n_callbacks)],
        )
        trainer.fit(module, train_dataloaders=data)

    setup_ms: list[float] = []
    ms = wl.measure(fit_epoch, w, reps, setup_ms, warmup)
    per_cb = len(PER_BATCH_HOOKS) if spec.action == "noop" else 1
    return ms, setup_ms, spec.n_callbacks * per_cb


def main() -> None:
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="pytorch_lightning")
    wl.run_main(__doc__ or "", "lightning", pl.__version__, bench)


if __name__ == "__main__":
    main()
