"""trainbus: per-batch overhead of its Trainer and of its callbacks, in the peers' format.

A fresh ``trainbus.Trainer`` (SGD, cross-entropy, device="cpu", no loggers, so no per-batch
loss logging) trains one epoch over the 200 in-memory batches per repetition, with
``fit_sync()`` (which starts an asyncio loop; the training loop runs on a worker thread).
Scenarios as for the peers — no-op callbacks override all 12 per-batch events — plus the
variants only trainbus has:

    b-async / c-async   the no-op callbacks written as ``async def``
    b-blocking          the no-op handlers marked ``@trainbus.blocking``
    d-async             the 5 ms blocking callbacks as ``await anyio.sleep(0.005)``
    d-lag1              scenario d with ``Trainer(max_lag=1)``
    e                   ``HTTPMetricsUploader`` logging the loss every batch (batched,
                        async POSTs to the 20 ms server; delivery finishes at close,
                        inside the timed window)
    e-async             an ``async def`` batch_end POSTing the loss with httpx, one request
                        per batch, awaited before the next batch (BATCH_END is a barrier)

Run:  python benchmarks/peers/run_trainbus.py --scenario b-async --reps 15
      python benchmarks/peers/run_trainbus.py --serve    # a worker for run_all_peers.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import anyio
import workloads as wl

import trainbus
from trainbus import Callback, Trainer

SCENARIOS = {
    **wl.SCENARIOS,
    "b-async": wl.Scenario("b-async", "10 async no-op callbacks on every per-batch event", 10,
                           "noop-async"),
    "c-async": wl.Scenario("c-async", "100 async no-op callbacks on every per-batch event",
                           100, "noop-async"),
    "b-blocking": wl.Scenario("b-blocking", "10 @blocking no-op callbacks", 10, "noop-blocking"),
    "d-async": wl.Scenario("d-async", "4 callbacks awaiting anyio.sleep(0.005) at batch end", 4,
                           "sleep-async"),
    "d-lag1": wl.Scenario("d-lag1", "scenario d with max_lag=1", 4, "sleep"),
    "e-async": wl.Scenario("e-async", "async httpx POST of the loss per batch", 1, "upload-async"),
}


def noop_class(kind: str) -> type[Callback]:
    methods: dict[str, Any] = {}
    for name in wl.PER_BATCH_POINTS:
        if kind == "noop-async":
            async def handler(self: Any, state: Any, logger: Any) -> None:
                return None
        else:
            def handler(self: Any, state: Any, logger: Any) -> None:
                return None
            if kind == "noop-blocking":
                handler = trainbus.blocking(handler)
        methods[name] = handler
    return type(f"Noop_{kind}", (Callback,), methods)


class SleepSync(Callback):
    def batch_end(self, state: Any, logger: Any) -> None:
        time.sleep(0.005)


class SleepAsync(Callback):
    async def batch_end(self, state: Any, logger: Any) -> None:
        await anyio.sleep(0.005)


class LogLoss(Callback):
    """Logs the loss each batch; the uploader (a LoggerDestination) receives it."""

    def batch_end(self, state: Any, logger: Any) -> None:
        logger.log_metrics({"loss": state.loss})


class AsyncPost(Callback):
    def __init__(self, url: str) -> None:
        import httpx

        self.url = url
        self.client = httpx.AsyncClient()

    async def batch_end(self, state: Any, logger: Any) -> None:
        point = {"name": "loss", "value": float(state.loss), "step": int(state.timer.batch),
                 "wall_time": time.time()}
        response = await self.client.post(self.url, json={"run": "bench", "points": [point]})
        response.raise_for_status()

    async def close(self, state: Any, logger: Any) -> None:
        await self.client.aclose()


def callbacks_for(spec: wl.Scenario, url: str | None) -> tuple[list[Callback], list[Any]]:
    n, action = spec.n_callbacks, spec.action
    if action.startswith("noop"):
        cls = noop_class(action)
        return [cls() for _ in range(n)], []
    if action == "sleep":
        return [SleepSync() for _ in range(n)], []
    if action == "sleep-async":
        return [SleepAsync() for _ in range(n)], []
    assert url is not None
    if action == "upload-async":
        return [AsyncPost(url)], []
    from trainbus.loggers import HTTPMetricsUploader

    return [LogLoss()], [HTTPMetricsUploader(url, batch_size=50, flush_interval=0.2)]


def bench(w: wl.Workload, spec: wl.Scenario, url: str | None, reps: int,
          warmup: int) -> tuple[list[float], list[float], int]:
    """trainbus in ``spec`` (see workloads.Bench)."""

    def fit_epoch(data: wl.TimedBatches) -> None:
        callbacks, loggers = callbacks_for(spec, url)
        trainer = Trainer(
            w.model, data, "1ep", loss_fn=w.loss_fn, optimizers=w.optimizer(),
            callbacks=callbacks, loggers=loggers, device="cpu",
            max_lag=1 if spec.key == "d-lag1" else 0,
            log_train_loss=False, warn_slow_callbacks=False,
        )
        trainer.fit_sync()

    setup_ms: list[float] = []
    ms = wl.measure(fit_epoch, w, reps, setup_ms, warmup)
    per_cb = len(wl.PER_BATCH_POINTS) if spec.action.startswith("noop") else 1
    return ms, setup_ms, spec.n_callbacks * per_cb


def main() -> None:
    wl.run_main(__doc__ or "", "trainbus", trainbus.__version__, bench, SCENARIOS)


if __name__ == "__main__":
    main()
