"""PyTorch Lightning logging 10 metrics per batch to MLflow: a worker for bench_mlflow.py.

Runs in the Lightning venv (``benchmarks/.venvs/lightning``, plus ``mlflow-skinny``, the
client Lightning's ``MLFlowLogger`` needs). It reads one JSON command per line on stdin
and answers one JSON line per fit on stdout, so bench_mlflow.py can interleave its
repetitions with trainbus's, round by round, without importing Lightning each time.

Modes (one epoch of the workload per command, a fresh Trainer each time; no
checkpointing, progress bar, model summary or validation):

    none          a callback computes the 10 values at ``on_train_batch_end``, logs nothing;
                  ``logger=False``
    log           it logs them with ``pl_module.log_dict(on_step=True)``; ``logger=False``
                  (Lightning's own logging machinery, no destination)
    mlflow        the same with ``MLFlowLogger(tracking_uri=...)``, ``log_every_n_steps=1``
                  (one ``log_batch`` per step on the training thread; Lightning adds an
                  ``epoch`` value: 11 metrics per request)
    mlflow-async  the same with ``MLFlowLogger(synchronous=False)``: MLflow's async queue

Command: ``{"mode": ..., "url": ..., "experiment": ..., "db": <sqlite path>}``. Answer: the
figures of :meth:`mlflow_points.Meter.per_batch`, ``fit_ms`` (end of the last batch ->
``fit()`` returned) and ``readable_ms`` (end of the last batch -> every point readable in
the server's store; 0 without a logger). Run by bench_mlflow.py; by hand:

    echo '{"mode": "none"}' | benchmarks/.venvs/lightning/bin/python \\
        benchmarks/peers/run_lightning_mlflow.py
"""

from __future__ import annotations

import json
import logging
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlflow_points as mp
import pytorch_lightning as pl
import workloads as wl


class Values(pl.Callback):
    def __init__(self, meter: mp.Meter, log: bool) -> None:
        # not ``self.log``: Lightning sets that attribute on callbacks (its logging method)
        self.meter, self.log_values = meter, log

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        metrics = mp.values(trainer.global_step)
        if self.log_values:
            pl_module.log_dict(metrics, on_step=True, on_epoch=False)
        self.meter.mark()


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


def fit(module: Module, w: wl.Workload, command: dict) -> dict:
    from pytorch_lightning.loggers import MLFlowLogger

    mode = command["mode"]
    logger = False
    if mode.startswith("mlflow"):
        logger = MLFlowLogger(experiment_name=command["experiment"],
                              tracking_uri=command["url"], synchronous=mode == "mlflow")
    meter = mp.Meter()
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, logger=logger, log_every_n_steps=1,
        callbacks=[Values(meter, log=mode != "none")], enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, train_dataloaders=wl.TimedBatches(w.batches))
    returned = time.perf_counter()
    out = meter.per_batch()
    out["fit_ms"] = (returned - out["t_last"]) * 1e3
    out["readable_ms"] = 0.0
    if logger:
        n = len(w.batches) * len(mp.KEYS)
        out["readable_ms"] = (mp.wait_readable(command["db"], logger.run_id, n)
                              - out["t_last"]) * 1e3
    return out


def main() -> None:
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    w = wl.make_workload("mlp")
    module = Module(w)
    answers, sys.stdout = sys.stdout, sys.stderr  # MLflow prints links to its runs
    print(json.dumps({"version": pl.__version__}), file=answers, flush=True)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(fit(module, w, json.loads(line))), file=answers, flush=True)


if __name__ == "__main__":
    main()
