"""Event-loop CPU per batch of one ``@trailing(2)`` async handler, next to bare asyncio.

What the loop thread spends (``time.thread_time()`` of the thread that awaits ``fit()``, so
it does not depend on the machine's load) to run one trailing ``async def batch_end`` per
batch. The training step is a 10 ms ``time.sleep`` in ``forward`` (the training thread holds
no GIL and no core), so the loop's CPU is the bus's and the handler's, nothing else.
Rows (interleaved rounds; median and min over rounds):

- ``bus, no handler``: ``fit()`` with no callback;
- ``bus, no-op``: a trailing handler that returns without suspending (wake-up and one call);
- ``bus, sleep 5 ms``: a trailing handler awaiting ``anyio.sleep(0.005)`` (it suspends);
- ``bare asyncio, sleep 5 ms``: the least the same work can cost: a thread wakes the loop
  with ``call_soon_threadsafe`` every 10 ms, which creates a task that sleeps 5 ms.

Run:  PYTHONPATH=src python benchmarks/bench_loop_cost.py [--batches 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import anyio
import torch

import trainbus


class Sleepy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.01)
        return self.linear(x)


class SleepUpload(trainbus.Callback):
    @trainbus.trailing(2)
    async def batch_end(self, state: Any, logger: Any) -> None:
        await anyio.sleep(0.005)


class NoOp(trainbus.Callback):
    @trainbus.trailing(2)
    async def batch_end(self, state: Any, logger: Any) -> None:
        pass


async def bus(callbacks: list[trainbus.Callback], batches: int) -> float:
    data = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(batches)]
    trainer = trainbus.Trainer(
        Sleepy(), data, "1ep", loss_fn=torch.nn.functional.cross_entropy, device="cpu",
        callbacks=callbacks, log_train_loss=False, warn_slow_callbacks=False,
    )
    cpu = time.thread_time()
    await trainer.fit()
    return (time.thread_time() - cpu) * 1e3 / batches


async def bare(batches: int) -> float:
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()

    async def job() -> None:
        await asyncio.sleep(0.005)

    def spawn() -> None:
        task = loop.create_task(job())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def producer() -> None:
        for _ in range(batches):
            time.sleep(0.01)
            loop.call_soon_threadsafe(spawn)

    cpu = time.thread_time()
    await anyio.to_thread.run_sync(producer)
    while tasks:
        await asyncio.sleep(0.001)
    return (time.thread_time() - cpu) * 1e3 / batches


async def main(batches: int, rounds: int) -> None:
    rows: dict[str, list[float]] = {
        "bus, no handler": [], "bus, no-op": [], "bus, sleep 5 ms": [],
        "bare asyncio, sleep 5 ms": [],
    }
    for _ in range(rounds):
        rows["bus, no handler"].append(await bus([], batches))
        rows["bus, no-op"].append(await bus([NoOp()], batches))
        rows["bus, sleep 5 ms"].append(await bus([SleepUpload()], batches))
        rows["bare asyncio, sleep 5 ms"].append(await bare(batches))
    print("| row | loop thread CPU per batch, median (min) |\n|---|---|")
    for name, values in rows.items():
        print(f"| {name} | {statistics.median(values):.3f} ms ({min(values):.3f}) |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    anyio.run(main, args.batches, args.rounds, backend="asyncio")
