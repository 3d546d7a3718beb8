"""Scenario (f): event-loop lateness while trainbus trains in a worker thread.

A heartbeat task sleeps 1 ms in a loop and records how late each wake-up is. Measured
on an idle loop, then while a trainbus Trainer trains the benchmark MLP (256-512-10, batch
64, one torch thread) on the same loop with 10 async no-op callbacks on every per-batch
event, in the same process. Reports p50 / p99 / max lateness in ms.

With ``--rounds R`` the idle and the training measurements alternate R times in the same
process (one figure from one run moved from 1.4 to 3.0 ms between runs here): each row's
p50 / p99 / max are then the median over rounds of each round's figure, and the p99 of every
round is listed (``p99_rounds``), with their min and max.

Run:  python benchmarks/bench_lateness.py [--epochs 5] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
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


def figures(lateness: list[float]) -> dict[str, float]:
    return {"p50_ms": pct(lateness, 0.5), "p99_ms": pct(lateness, 0.99),
            "max_ms": max(lateness) * 1e3, "beats": len(lateness)}


async def beat_while(task: Any, out: list[float]) -> float:
    """Run the heartbeat while ``await task()`` runs; return the seconds it took."""
    stop = anyio.Event()
    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(heartbeat, stop, out)
        await task()
        stop.set()
    return time.perf_counter() - t0


async def measure(epochs: int, rounds: int = 1, idle_s: float = 2.0) -> dict[str, Any]:
    w = wl.make_workload("mlp")
    cls = noop_class("noop-async")
    per_round: dict[str, list[dict[str, float]]] = {"idle": [], "training": []}
    ms_per_batch = []
    for _ in range(rounds):
        idle: list[float] = []
        await beat_while(lambda: anyio.sleep(idle_s), idle)
        per_round["idle"].append(figures(idle))
        trainer = Trainer(w.model, w.batches, f"{epochs}ep", loss_fn=w.loss_fn,
                          optimizers=w.optimizer(), callbacks=[cls() for _ in range(10)],
                          device="cpu", warn_slow_callbacks=False)
        busy: list[float] = []
        elapsed = await beat_while(trainer.fit, busy)
        per_round["training"].append(figures(busy))
        ms_per_batch.append(elapsed * 1e3 / (epochs * len(w.batches)))
    out: dict[str, Any] = {}
    for name, rows in per_round.items():
        p99s = [r["p99_ms"] for r in rows]
        out[name] = {
            **{key: statistics.median(r[key] for r in rows) for key in rows[0]},
            "rounds": rounds, "p99_rounds": p99s, "p99_min_ms": min(p99s),
            "p99_max_ms": max(p99s),
        }
    out["training"]["ms_per_batch"] = statistics.median(ms_per_batch)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1,
                        help="idle and training measurements alternated this many times")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.epochs < 1:
        parser.error("--rounds and --epochs must be >= 1")
    torch.set_num_threads(1)
    result = anyio.run(measure, args.epochs, args.rounds)
    for name, r in result.items():
        print(f"{name:>9}: p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms  "
              f"max {r['max_ms']:.2f} ms  ({r['beats']:.0f} beats; median of {r['rounds']} "
              f"round(s); p99 per round {', '.join(f'{x:.2f}' for x in r['p99_rounds'])})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
