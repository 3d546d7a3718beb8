"""Metrics upload during training: HTTPMetricsUploader vs synchronous POSTs, ms per batch.

Workload (benchmarks/workloads.py): MLP 256-512-10, batch 64, 200 batches, CPU, one torch
thread. The trainer logs ``loss/train`` once per batch; each scenario delivers those 200
points to a local HTTP server (benchmarks/latency_server.py) that answers every POST
after 20 ms. Scenarios, run in one process with repetitions interleaved:

    none            trainbus, no callbacks and no loggers (no upload at all)
    log-only        the trainer logs loss/train to a no-op async destination: the cost of
                    logging itself, which every uploader scenario pays too
    uploader        HTTPMetricsUploader (batch_size=100, flush_interval=1 s): batches of
                    points POSTed by its sender task on the event loop (httpx)
    uploader-b1     the same with batch_size=1: one request per point, like the sync ones
    sync-thread     a plain callback POSTs each point with urllib at BATCH_END; it runs on
                    its own thread, but BATCH_END is a barrier, so training waits for it
    sync-blocking   the same callback marked @trainbus.blocking: it runs on the training
                    thread itself, which is what Composer does with every callback

Reported per scenario (median over repetitions, min-max in brackets):

    train ms/batch  first batch fetched -> FIT_END published (the training itself)
    total ms/batch  first batch fetched -> fit() returned (includes close: the uploader's
                    flush of what is left, so the last points are on the server)
    requests        POSTs the server answered in the last repetition

and each scenario's train time relative to ``none`` and its extra ms over ``log-only``. The server's
handler sends with TCP_NODELAY: with Nagle's algorithm on, a keep-alive client (httpx)
waits ~40 ms more per request for a delayed ACK, which urllib's one-shot connections
do not, and the comparison would measure that instead.

Run:  python benchmarks/bench_uploader.py [--reps 5] [--latency-ms 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads
from latency_server import LatencyServer, _Handler

import trainbus
from trainbus import Callback, Trainer
from trainbus.loggers import HTTPMetricsUploader


class _NoDelayHandler(_Handler):
    disable_nagle_algorithm = True


class SyncPost(Callback):
    """Composer-style: POST the batch's loss and wait for the answer."""

    def __init__(self, url: str) -> None:
        self.url = url

    def batch_end(self, state: Any, logger: Any) -> None:
        workloads.post_metrics(self.url, int(state.timer.batch), state.loss.item())


class BlockingSyncPost(SyncPost):
    """The same, in lockstep on the training thread (``@blocking``)."""

    @trainbus.blocking
    def batch_end(self, state: Any, logger: Any) -> None:
        workloads.post_metrics(self.url, int(state.timer.batch), state.loss.item())


class NullDestination(trainbus.LoggerDestination):
    """Receives every record on a loop lane and drops it."""

    async def log_record(self, record: trainbus.LogRecord) -> None:
        return None


class FitEndClock(Callback):
    """Notes when FIT_END is published (on the training thread: ``@blocking``)."""

    def __init__(self) -> None:
        self.at = 0.0

    @trainbus.blocking
    def fit_end(self, state: Any, logger: Any) -> None:
        self.at = time.perf_counter()


Setup = Callable[[], tuple[list[Callback], list[trainbus.LoggerDestination]]]


def scenarios(url: str) -> dict[str, Setup]:
    return {
        "none": lambda: ([], []),
        "log-only": lambda: ([], [NullDestination()]),
        "uploader": lambda: ([], [HTTPMetricsUploader(url, batch_size=100)]),
        "uploader-b1": lambda: ([], [HTTPMetricsUploader(url, batch_size=1)]),
        "sync-thread": lambda: ([SyncPost(url)], []),
        "sync-blocking": lambda: ([BlockingSyncPost(url)], []),
    }


def run_once(w: workloads.Workload, setup: Setup) -> tuple[float, float]:
    """(train, total) ms per batch of one epoch."""
    callbacks, loggers = setup()
    clock = FitEndClock()
    data = workloads.TimedBatches(w.batches)
    trainer = Trainer(
        w.model, data, "1ep", loss_fn=w.loss_fn, optimizers=w.optimizer(),
        callbacks=[*callbacks, clock], loggers=loggers, device="cpu",
        warn_slow_callbacks=False, log_train_loss=bool(loggers),
    )
    trainer.fit_sync()
    done = time.perf_counter()
    assert data.t_first is not None
    n = len(w.batches)
    return (clock.at - data.t_first) * 1e3 / n, (done - data.t_first) * 1e3 / n


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    w = workloads.make_workload("mlp")
    with LatencyServer(latency_ms=args.latency_ms) as server:
        server._server.RequestHandlerClass = _NoDelayHandler
        table = scenarios(server.url)
        for setup in table.values():  # warm-up
            run_once(w, setup)
        train: dict[str, list[float]] = {n: [] for n in table}
        total: dict[str, list[float]] = {n: [] for n in table}
        requests: dict[str, int] = {}
        for _ in range(args.reps):
            for name, setup in table.items():
                before = server.requests
                t, tt = run_once(w, setup)
                train[name].append(t)
                total[name].append(tt)
                requests[name] = server.requests - before
    base = statistics.median(train["none"])
    print(f"{len(w.batches)} batches of MLP 256-512-10, batch 64, 1 torch thread; "
          f"server latency {args.latency_ms:g} ms; {args.reps} reps (median [min-max])")
    log_only = statistics.median(train["log-only"])
    print(f"{'scenario':<15}{'train ms/batch':>24}{'total ms/batch':>24}{'requests':>10}"
          f"{'vs none':>9}{'+ms vs log-only':>17}")
    report: dict[str, Any] = {}
    for name in table:
        tm, ttm = statistics.median(train[name]), statistics.median(total[name])
        span = f"[{min(train[name]):.2f}-{max(train[name]):.2f}]"
        tspan = f"[{min(total[name]):.2f}-{max(total[name]):.2f}]"
        print(f"{name:<15}{tm:>9.3f} {span:>14}{ttm:>9.3f} {tspan:>14}{requests[name]:>10}"
              f"{tm / base:>8.2f}x{tm - log_only:>+17.3f}")
        report[name] = {"train_ms": train[name], "total_ms": total[name],
                        "requests": requests[name]}
    sync = statistics.median(train["sync-blocking"])
    up = statistics.median(train["uploader"])
    print(f"ratio sync-blocking / uploader (train ms/batch): {sync / up:.1f}x")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
