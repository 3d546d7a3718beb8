"""The floor under scenario (g): a trailing 5 ms upload per batch without any bus.

Scenario (g) (SPEC section 7, issue 13): an ``async def batch_end`` awaiting one POST to a
local server answering after 5 ms, declared ``@trainbus.trailing(2)``, on an MLP whose batch
takes about 10 ms; target: at most +0.5 ms/batch over the plain loop. What is left of the
upload once its 5 ms wait is hidden is the client's own CPU on the event loop thread, which
holds the GIL while it runs (``bench_http_client.py``: about 2 ms of CPU per httpx POST
here). This benchmark measures that floor with nothing of trainbus in it, beside trainbus,
in the same process and rounds (MLP 512-``--hidden``-10, batch 128, one torch thread;
``--batches`` batches per arm and round, arms in a fresh random order each round):

    plain       the hand-written loop
    floor       the loop + an asyncio loop in another thread: at each batch end one
                ``call_soon_threadsafe`` hands the batch to one task that awaits the POSTs
                one after another (as one callback's handler calls run, D1) with the same
                client and payload as (g); the training thread goes on, and waits only when
                the upload of two batches before has not finished (the lag of 2); the last
                uploads are awaited after the last batch, inside the timing
    tb-none     trainbus's Trainer, no callbacks
    tb-g        trainbus's Trainer with (g)'s upload callback at ``trailing(2)``

``--client`` picks the client of both ``floor`` and ``tb-g`` (``httpx``, the scenario's;
``raw``, a hand-written HTTP/1.1 client with a tenth of httpx's instructions; ``sleep``, no
request: ``anyio.sleep`` of the same 5 ms). Per round, ms per batch: floor - plain,
tb-g - plain, tb-g - tb-none and tb-g - floor (what the bus adds to the bare mechanism);
over rounds, the median with a distribution-free 95% interval and the spread.

Run:  python benchmarks/bench_trailing_floor.py [--rounds 30] [--client httpx|raw|sleep]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import paired_stats
import torch
from bench_trailing import _step, make_data, make_model
from trailing_callbacks import LATENCY_MS, TrailingUpload, Upload
from upload_server import latency_server

import trainbus

LAG = 2


class FloorUploader:
    """The bare mechanism: a loop thread, one task uploading batches in order, the lag of 2
    enforced by the training thread waiting on a condition."""

    def __init__(self, url: str, client: str) -> None:
        self.url = url
        self.client = client
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.done = 0
        self.error: Exception | None = None
        self.cond = threading.Condition()
        self.queue: asyncio.Queue[int] | None = None
        self.worker: asyncio.Task[None] | None = None
        self.upload: Upload | None = None

    async def _open(self) -> None:
        self.queue = asyncio.Queue()
        self.worker = asyncio.get_running_loop().create_task(self._work())
        self.upload = Upload(self.url, self.client)  # (g)'s client and payload

    async def _work(self) -> None:
        assert self.queue is not None
        while True:
            batch = await self.queue.get()
            try:
                assert self.upload is not None
                await self.upload.send(batch)
            except Exception as exc:  # noted; the training thread raises it
                self.error = exc
            with self.cond:
                self.done += 1
                self.cond.notify_all()

    def start(self) -> None:
        asyncio.run_coroutine_threadsafe(self._open(), self.loop).result()
        self.done = 0

    def submit(self, batch: int, k: int) -> None:
        """Upload ``batch`` as the ``k``-th upload (1-based); wait for the (k - LAG)-th."""
        assert self.queue is not None
        self.loop.call_soon_threadsafe(self.queue.put_nowait, batch)
        if self.done < k - LAG:
            with self.cond:
                self.cond.wait_for(lambda: self.done >= k - LAG)

    def finish(self, batches: int) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.done >= batches)
        if self.error is not None:
            raise RuntimeError("an upload failed") from self.error

    def close(self) -> None:
        async def shut() -> None:
            if self.worker is not None:
                self.worker.cancel()
            if self.upload is not None:
                await self.upload.close(None, None)

        asyncio.run_coroutine_threadsafe(shut(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


def arms(hidden: int, data: list[Any], url: str, client: str) -> dict[str, Callable[[], float]]:
    """Each arm: one fresh model, ``len(data)`` batches; returns ms per batch."""

    def plain() -> float:
        model = make_model(hidden)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        t0 = time.perf_counter()
        for x, y in data:
            _step(model, opt, x, y)
        return (time.perf_counter() - t0) / len(data) * 1e3

    def floor() -> float:
        model = make_model(hidden)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        up = FloorUploader(url, client)
        up.start()
        try:
            t0 = time.perf_counter()
            for batch, (x, y) in enumerate(data, 1):
                _step(model, opt, x, y)
                up.submit(batch, batch)
            up.finish(len(data))
            return (time.perf_counter() - t0) / len(data) * 1e3
        finally:
            up.close()

    def trainer(upload: bool) -> Callable[[], float]:
        def run() -> float:
            model = make_model(hidden)
            clock = _Clock()
            callbacks: list[trainbus.Callback] = [clock]
            if upload:
                callbacks.append(TrailingUpload(url, client))
            t = trainbus.Trainer(model, data, "1ep",
                                 loss_fn=torch.nn.functional.cross_entropy,
                                 optimizers=torch.optim.SGD(model.parameters(), lr=0.01),
                                 callbacks=callbacks, device="cpu", log_train_loss=False,
                                 warn_slow_callbacks=False)
            t.fit_sync()
            return (clock.end - clock.start) / len(data) * 1e3
        return run

    return {"plain": plain, "floor": floor, "tb-none": trainer(False), "tb-g": trainer(True)}


class _Clock(trainbus.Callback):
    """From the first batch's start to ``FIT_END`` (after the last uploads: close waits)."""

    start = end = 0.0

    @trainbus.blocking
    def fit_start(self, state: Any, logger: Any) -> None:
        self.start = time.perf_counter()

    @trainbus.blocking
    def post_close(self) -> None:
        self.end = time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--hidden", type=int, default=2112)
    parser.add_argument("--client", choices=("httpx", "raw", "sleep"), default="httpx")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = make_data(args.batches)
    rng = random.Random(args.seed)
    started = time.time()
    with latency_server(LATENCY_MS) as url:
        runs = arms(args.hidden, data, url, args.client)
        for run in runs.values():  # warm-up
            run()
        ms: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            order = list(runs)
            rng.shuffle(order)
            for name in order:
                ms[name].append(runs[name]())
    print(f"MLP 512-{args.hidden}-10, batch 128, 1 torch thread; client {args.client}, "
          f"{LATENCY_MS:g} ms server, lag {LAG}; {args.batches} batches per arm and round, "
          f"{args.rounds} rounds in random order (seed {args.seed}); "
          f"{time.time() - started:.0f} s; load average {os.getloadavg()[0]:.2f} on "
          f"{os.cpu_count()} CPUs\n")
    print("| arm | ms/batch, median over rounds |\n|---|---|")
    for name, xs in ms.items():
        print(f"| {name} | {statistics.median(xs):.3f} |")
    print("\n| per round, paired (ms/batch) | median | 95% CI of the median | "
          "min / p25 / median / p75 / max | +0.5 ms |\n|---|---|---|---|---|")
    for arm, base in (("floor", "plain"), ("tb-g", "plain"), ("tb-g", "tb-none"),
                      ("tb-none", "plain"), ("tb-g", "floor")):
        xs = [a - b for a, b in zip(ms[arm], ms[base], strict=True)]
        interval = paired_stats.median_interval(xs)
        ci = "n/a" if interval is None else f"{interval[0]:+.3f} .. {interval[1]:+.3f}"
        verdict = paired_stats.verdict(interval, 0.5) if arm != "tb-none" else "-"
        print(f"| {arm} - {base} | {statistics.median(xs):+.3f} | {ci} | "
              f"{paired_stats.spread(xs, '+.3f')} | {verdict} |")


if __name__ == "__main__":
    main()
