"""MosaicML Composer: per-batch overhead of its Trainer and of its Callback events.

A ComposerModel (forward = the workload's MLP, loss = cross-entropy, no train
metrics) fits one epoch over the 200 in-memory batches per repetition with the
workload's torch SGD, a fresh Trainer each time, with no loggers, console
logging, progress bar, checkpointing (save_folder=None), evaluation or
algorithms, fp32 on CPU. No-op callbacks override every per-batch event of
Composer 0.32 (before_dataloader, after_dataloader, batch_start,
before_train_batch, before/after_forward, before/after_loss,
before/after_backward, after_train_batch, batch_end, batch_checkpoint: 13 calls
per batch each); the sleep and upload callbacks use batch_end. Run in its venv:

    benchmarks/.venvs/composer/bin/python benchmarks/peers/run_composer.py --scenario a
    benchmarks/.venvs/composer/bin/python benchmarks/peers/run_composer.py --serve  # a worker
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# composer.utils.misc imports torchvision. PyPI has only CUDA builds of it, whose
# C ops cannot load next to the CPU torch; torchvision then still registers fake
# kernels for these two ops, so declare them (as its C library would) first.
for _op in ("nms", "qnms"):
    torch.library.define(f"torchvision::{_op}",
                         "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
warnings.filterwarnings("ignore", message=".*torchvision.*")

import composer  # noqa: E402
import workloads as wl  # noqa: E402
from composer import Callback, Trainer  # noqa: E402
from composer.models import ComposerModel  # noqa: E402

PER_BATCH_EVENTS = (
    "before_dataloader", "after_dataloader", "batch_start", "before_train_batch",
    "before_forward", "after_forward", "before_loss", "after_loss", "before_backward",
    "after_backward", "after_train_batch", "batch_end", "batch_checkpoint",
)


class NoOp(Callback):
    pass


for _event in PER_BATCH_EVENTS:
    setattr(NoOp, _event, lambda self, state, logger: None)


class Sleeper(Callback):
    def batch_end(self, state, logger):
        wl.sleep_5ms()


class Uploader(Callback):
    def __init__(self, url: str) -> None:
        self.url = url

    def batch_end(self, state, logger):
        wl.post_metrics(self.url, int(state.timestamp.batch), state.loss.item())


class Model(ComposerModel):
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


def bench(w: wl.Workload, spec: wl.Scenario, url: str | None, reps: int,
          warmup: int) -> tuple[list[float], list[float], int]:
    """Composer in ``spec`` (see workloads.Bench)."""
    model = Model(w)
    opt = w.optimizer()
    factory = {"noop": NoOp, "sleep": Sleeper, "upload": lambda: Uploader(url)}[spec.action]

    def fit_epoch(data: wl.TimedBatches) -> Callable[[], None]:
        trainer = Trainer(
            model=model, train_dataloader=data, max_duration="1ep", optimizers=opt,
            callbacks=[factory() for _ in range(spec.n_callbacks)], loggers=[],
            progress_bar=False, log_to_console=False, save_folder=None, device="cpu",
            precision="fp32", device_train_microbatch_size=wl.BATCH_SIZE,
            spin_dataloaders=False, auto_log_hparams=False, seed=0,
        )
        trainer.fit()
        return trainer.close  # fit() leaves the engine open; closed after the clock stops

    setup_ms: list[float] = []
    ms = wl.measure(fit_epoch, w, reps, setup_ms, warmup)
    per_cb = len(PER_BATCH_EVENTS) if spec.action == "noop" else 1
    return ms, setup_ms, spec.n_callbacks * per_cb


def main() -> None:
    warnings.filterwarnings("ignore", module="composer")
    wl.run_main(__doc__ or "", "composer", composer.__version__, bench)


if __name__ == "__main__":
    main()
