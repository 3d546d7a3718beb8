"""Scenario (f): event-loop lateness while trainbus trains in a worker thread.

A heartbeat task sleeps 1 ms in a loop and records how late each wake-up is. Measured
on an idle loop, then while a trainbus Trainer trains the benchmark MLP (256-512-10, batch
64, one torch thread) on the same loop with 10 async no-op callbacks on every per-batch
event, in the same process. Reports p50 / p99 / max lateness in ms.

Run:  python benchmarks/bench_lateness.py [--epochs 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
import workloads as wl
from run_trainbus import noop_class

from trainbus import Trainer


async def heartbeat(stop: anyio.Event, out: list[float]) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        await anyio.sleep(0.001)
        out.append(time.perf_counter() - t0 - 0.001)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


async def measure(epochs: int) -> dict[str, Any]:
    w = wl.make_workload("mlp")
    idle: list[float] = []
    busy: list[float] = []
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(heartbeat, stop, idle)
        await anyio.sleep(2.0)
        stop.set()
    cls = noop_class("noop-async")
    trainer = Trainer(w.model, w.batches, f"{epochs}ep", loss_fn=w.loss_fn,
                      optimizers=w.optimizer(), callbacks=[cls() for _ in range(10)],
                      device="cpu", warn_slow_callbacks=False)
    stop = anyio.Event()
    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(heartbeat, stop, busy)
        await trainer.fit()
        stop.set()
    elapsed = time.perf_counter() - t0
    return {
        "idle": {"p50_ms": pct(idle, 0.5), "p99_ms": pct(idle, 0.99), "max_ms": max(idle) * 1e3,
                 "beats": len(idle)},
        "training": {"p50_ms": pct(busy, 0.5), "p99_ms": pct(busy, 0.99),
                     "max_ms": max(busy) * 1e3, "beats": len(busy),
                     "ms_per_batch": elapsed * 1e3 / (epochs * len(w.batches))},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = anyio.run(measure, args.epochs)
    for name, r in result.items():
        print(f"{name:>9}: p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms  "
              f"max {r['max_ms']:.2f} ms  ({r['beats']} beats)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
