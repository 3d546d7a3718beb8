"""PyTorch Lightning (``barebones=True``): no-op callbacks on its 6 per-batch hooks."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import pytorch_lightning as pl

from harness import workload as wl

NAME = "lightning"
VERSION = f"pytorch-lightning {pl.__version__}"
PER_BATCH_HOOKS = ("on_train_batch_start", "on_before_backward", "on_after_backward",
                   "on_before_optimizer_step", "on_before_zero_grad", "on_train_batch_end")
logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", module="pytorch_lightning")
warnings.filterwarnings("ignore", module="lightning")


class _NoOp(pl.Callback):
    pass


for _hook in PER_BATCH_HOOKS:
    setattr(_NoOp, _hook, lambda self, *args, **kwargs: None)


class _Sleeper(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        wl.sleep_5ms()


class _Uploader(pl.Callback):
    def __init__(self, url: str) -> None:
        self.url = url

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        wl.post_metrics(self.url, trainer.global_step, outputs["loss"].item())


class _Module(pl.LightningModule):
    def __init__(self, w: wl.Workload) -> None:
        super().__init__()
        self.w = w
        self.model = w.model

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.w.loss_fn(self.model(x), y)

    def configure_optimizers(self):
        return self.w.optimizer()


def make_fit(w: wl.Workload, scenario: str, n: int, url: str | None) -> tuple[Any, int]:
    factory = {"noop": _NoOp, "sleep": _Sleeper, "upload": lambda: _Uploader(url)}[scenario]
    module = _Module(w)

    def fit(data: Any) -> None:
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, barebones=True,
                             limit_val_batches=0, callbacks=[factory() for _ in range(n)])
        trainer.fit(module, train_dataloaders=data)

    return fit, n * (len(PER_BATCH_HOOKS) if scenario == "noop" else 1)
