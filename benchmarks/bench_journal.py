"""The cost of the uploader's write-ahead journal: ms per batch with and without it.

Workload (benchmarks/workloads.py): MLP 256-512-10, batch 64, 200 batches, CPU, one torch
thread. A plain callback logs 10 metrics per batch at BATCH_END (2,000 points per run; the
trainer's own loss/train is off). Each scenario uploads them with HTTPMetricsUploader
(batch_size=100, flush_interval=1 s) to a local server (benchmarks/latency_server.py)
answering after 5 ms; spools live in a fresh temporary directory per run.

    memory          no spool_dir: batches kept in memory only (no durability at all)
    spool           spool_dir, one fsync-ed file per batch (the default)
    journal         spool_dir and journal=True: every point appended to the journal in
                    log_record (one os.write per record), one fsync per sealed batch
    spool+ckpt      spool, plus a CheckpointSaver every 20 batches
    journal+ckpt    journal, plus the same saver (the uploader's state_dict fsyncs the
                    journal on the training thread at each checkpoint)

Rounds are interleaved (each round runs every scenario once, in a rotated order) and the
journal's cost is reported as paired ratios journal / spool within a round (min, median,
max), plus the absolute train ms/batch (median [min-max]). It also reports the journal's
fsync count per run (its measured cadence) and the cost of one fsync of a small append on
this disk (median of 50), which is what the journal adds per sealed batch and per checkpoint.

Run:  python benchmarks/bench_journal.py [--rounds 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads
from latency_server import LatencyServer

import trainbus
from trainbus import Callback, Trainer
from trainbus.callbacks import CheckpointSaver
from trainbus.loggers import HTTPMetricsUploader


class TenMetrics(Callback):
    """Logs 10 numbers per batch (a plain handler, as most user callbacks are)."""

    def batch_end(self, state: Any, logger: Any) -> None:
        b = int(state.timer.batch)
        logger.log_metrics({f"metric/{i}": b * 0.001 + i for i in range(10)})


class FitEndClock(Callback):
    """Notes when FIT_END is published (on the training thread: ``@blocking``)."""

    def __init__(self) -> None:
        self.at = 0.0

    @trainbus.blocking
    def fit_end(self, state: Any, logger: Any) -> None:
        self.at = time.perf_counter()


def run_once(
    w: workloads.Workload, url: str, journal: bool, ckpt: bool, spool: bool = True
) -> tuple[float, int]:
    """(train ms/batch, journal fsyncs) of one epoch."""
    with tempfile.TemporaryDirectory() as tmp:
        uploader = HTTPMetricsUploader(
            url, batch_size=100, spool_dir=Path(tmp) / "spool" if spool else None,
            journal=journal,
        )  # fmt: skip
        clock = FitEndClock()
        callbacks: list[Callback] = [TenMetrics(), clock]
        if ckpt:
            callbacks.insert(0, CheckpointSaver(Path(tmp) / "ckpt", save_interval="20ba"))
        data = workloads.TimedBatches(w.batches)
        trainer = Trainer(
            w.model, data, "1ep", loss_fn=w.loss_fn, optimizers=w.optimizer(),
            callbacks=callbacks, loggers=[uploader], device="cpu",
            warn_slow_callbacks=False, log_train_loss=False,
        )  # fmt: skip
        trainer.fit_sync()
        assert data.t_first is not None
        assert uploader.statistics().points_sent == 10 * len(w.batches)
        fsyncs = uploader._journal.fsyncs if uploader._journal is not None else 0
        return (clock.at - data.t_first) * 1e3 / len(w.batches), fsyncs


def fsync_cost_ms(samples: int = 50) -> float:
    """Median ms of one ``os.fsync`` after a small append, in a temporary directory."""
    with tempfile.TemporaryDirectory() as tmp:
        fd = os.open(Path(tmp) / "f", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        times = []
        try:
            for _ in range(samples):
                os.write(fd, b'{"i":1,"name":"metric/0","value":1.0}\n' * 10)
                t0 = time.perf_counter()
                os.fsync(fd)
                times.append((time.perf_counter() - t0) * 1e3)
        finally:
            os.close(fd)
    return statistics.median(times)


SCENARIOS: dict[str, tuple[bool, bool, bool]] = {
    "memory": (False, False, False),
    "spool": (False, False, True),
    "journal": (True, False, True),
    "spool+ckpt": (False, True, True),
    "journal+ckpt": (True, True, True),
}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    w = workloads.make_workload("mlp")
    names = list(SCENARIOS)
    ms: dict[str, list[float]] = {n: [] for n in names}
    fsyncs: dict[str, int] = {}
    with LatencyServer(latency_ms=5) as server:
        for name in names:  # warm-up
            run_once(w, server.url, *SCENARIOS[name])
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                ms[name].append((result := run_once(w, server.url, *SCENARIOS[name]))[0])
                fsyncs[name] = result[1]
    one_fsync = fsync_cost_ms()
    n = len(w.batches)

    def ratios(a: str, b: str) -> list[float]:
        return [x / y for x, y in zip(ms[a], ms[b], strict=True)]

    print(f"{n} batches of MLP 256-512-10, 10 metrics/batch, {args.rounds} interleaved rounds")
    print(f"{'scenario':<14}{'train ms/batch median [min-max]':>34}{'journal fsyncs':>16}")
    for name in names:
        vals = ms[name]
        print(f"{name:<14}{statistics.median(vals):>14.3f} "
              f"[{min(vals):.3f}-{max(vals):.3f}]{fsyncs[name]:>16}")  # fmt: skip
    report: dict[str, Any] = {"ms_per_batch": ms, "fsyncs": fsyncs, "fsync_ms": one_fsync}
    for a, b in (("journal", "spool"), ("journal", "memory"), ("journal+ckpt", "spool+ckpt")):
        rs = ratios(a, b)
        report[f"{a}/{b}"] = rs
        print(f"paired {a}/{b}: median {statistics.median(rs):.3f} "
              f"[min {min(rs):.3f}, max {max(rs):.3f}]")  # fmt: skip
    print(f"one fsync of a small append here: {one_fsync:.3f} ms (median of 50)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
