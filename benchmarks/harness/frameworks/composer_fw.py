"""MosaicML Composer: no-op callbacks on its 13 per-batch events.

composer.utils.misc imports torchvision; PyPI has only CUDA builds of the release that
matches torch 2.13, whose C ops cannot load next to a CPU torch. torchvision then still
registers fake kernels for two ops, so they are declared here first (setup_peers.sh).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

for _op in ("nms", "qnms"):
    torch.library.define(f"torchvision::{_op}",
                         "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
warnings.filterwarnings("ignore", message=".*torchvision.*")
warnings.filterwarnings("ignore", module="composer")

import composer  # noqa: E402
from composer import Callback, Trainer  # noqa: E402
from composer.models import ComposerModel  # noqa: E402

from harness import workload as wl  # noqa: E402

NAME = "composer"
VERSION = f"mosaicml {composer.__version__}"
PER_BATCH_EVENTS = (
    "before_dataloader", "after_dataloader", "batch_start", "before_train_batch",
    "before_forward", "after_forward", "before_loss", "after_loss", "before_backward",
    "after_backward", "after_train_batch", "batch_end", "batch_checkpoint",
)


class _NoOp(Callback):
    pass


for _event in PER_BATCH_EVENTS:
    setattr(_NoOp, _event, lambda self, state, logger: None)


class _Sleeper(Callback):
    def batch_end(self, state, logger):
        wl.sleep_5ms()


class _Uploader(Callback):
    def __init__(self, url: str) -> None:
        self.url = url

    def batch_end(self, state, logger):
        wl.post_metrics(self.url, int(state.timestamp.batch), state.loss.item())


class _Model(ComposerModel):
    def __init__(self, w: wl.Workload) -> None:
        super().__init__()
        self.w = w
        self.model = w.model

    def forward(self, batch):
        return self.model(batch[0])

    def loss(self, outputs, batch):
        return self.w.loss_fn(outputs, batch[1])

    def get_metrics(self, is_train=False):
        return {}


def make_fit(w: wl.Workload, scenario: str, n: int, url: str | None) -> tuple[Any, int]:
    factory = {"noop": _NoOp, "sleep": _Sleeper, "upload": lambda: _Uploader(url)}[scenario]
    model = _Model(w)
    opt = w.optimizer()
    batch_size = w.batches[0][0].shape[0]

    def fit(data: Any) -> Any:
        trainer = Trainer(
            model=model, train_dataloader=data, max_duration="1ep", optimizers=opt,
            callbacks=[factory() for _ in range(n)], loggers=[], progress_bar=False,
            log_to_console=False, save_folder=None, device="cpu", precision="fp32",
            device_train_microbatch_size=batch_size, spin_dataloaders=False,
            auto_log_hparams=False, seed=0,
        )
        trainer.fit()
        return trainer.close  # fit() leaves the engine open; closed after the clock stops

    return fit, n * (len(PER_BATCH_EVENTS) if scenario == "noop" else 1)
