"""Trainer overhead: ms/batch of a plain torch loop vs trainbus, measured side by side.

Workload (benchmarks/workloads.py): MLP 256-512-10, batch 64, 200 batches, CPU, one torch
thread. Scenarios, each run in the same process, repetitions interleaved so drift hits all
of them alike:

    plain               hand-written loop, no callbacks
    plain+sleep         hand-written loop sleeping 5 ms per batch (the honest baseline for d)
    a                   trainbus, no callbacks
    b-sync / b-async    trainbus, 10 no-op callbacks on every per-batch event (def / async def)
    b-blocking          same, handlers marked @blocking (lockstep on the training thread)
    c-sync              trainbus, 100 no-op plain callbacks on every per-batch event
    d-sync / d-async    trainbus, 4 callbacks blocking 5 ms at BATCH_END (time.sleep / anyio.sleep)
    d-lag1              d-sync with max_lag=1

Reported: median ms/batch and min-max over repetitions, and the difference to the plain loop
(or to plain+sleep for d). Per handler call costs divide the b/c differences by the calls per
batch (12 per callback).

Run:  python benchmarks/bench_trainer.py [--reps 15] [--only a,b-sync] [--json out.json]
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
sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
import workloads
from run_trainbus import SleepAsync, SleepSync, noop_class

from trainbus import Callback, Trainer

PER_BATCH = workloads.PER_BATCH_POINTS


def _noop_class(kind: str) -> type[Callback]:
    return noop_class({"sync": "noop", "async": "noop-async", "blocking": "noop-blocking"}[kind])


def trainbus_runner(w: workloads.Workload, make_callbacks: Callable[[], list[Callback]],
                    **kw: Any) -> Callable[[workloads.TimedBatches], None]:
    def fit_epoch(data: workloads.TimedBatches) -> None:
        trainer = Trainer(
            w.model, data, "1ep", loss_fn=w.loss_fn, optimizers=w.optimizer(),
            callbacks=make_callbacks(), device="cpu", warn_slow_callbacks=False, **kw,
        )
        trainer.fit_sync()

    return fit_epoch


def plain_runner(w: workloads.Workload, sleep: float = 0.0) -> Callable[[workloads.TimedBatches], None]:
    def fit_epoch(data: workloads.TimedBatches) -> None:
        opt = w.optimizer()
        model, loss_fn = w.model, w.loss_fn
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            if sleep:
                time.sleep(sleep)

    return fit_epoch


def scenarios(w: workloads.Workload) -> dict[str, tuple[Callable[[workloads.TimedBatches], None], str]]:
    noop_sync, noop_async, noop_blocking = (_noop_class(k) for k in ("sync", "async", "blocking"))
    return {
        "plain": (plain_runner(w), "plain"),
        "plain+sleep": (plain_runner(w, 0.005), "plain"),
        "a": (trainbus_runner(w, list), "plain"),
        "b-sync": (trainbus_runner(w, lambda: [noop_sync() for _ in range(10)]), "a"),
        "b-async": (trainbus_runner(w, lambda: [noop_async() for _ in range(10)]), "a"),
        "b-blocking": (trainbus_runner(w, lambda: [noop_blocking() for _ in range(10)]), "a"),
        "c-sync": (trainbus_runner(w, lambda: [noop_sync() for _ in range(100)]), "a"),
        "d-sync": (trainbus_runner(w, lambda: [SleepSync() for _ in range(4)]), "plain+sleep"),
        "d-async": (trainbus_runner(w, lambda: [SleepAsync() for _ in range(4)]), "plain+sleep"),
        "d-lag1": (trainbus_runner(w, lambda: [SleepSync() for _ in range(4)], max_lag=1),
                   "plain+sleep"),
    }


CALLS_PER_BATCH = {"b-sync": 120, "b-async": 120, "b-blocking": 120, "c-sync": 1200}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--only", default="")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    w = workloads.make_workload("mlp")
    table = scenarios(w)
    wanted = set(args.only.split(",")) if args.only else set(table)
    wanted |= {table[n][1] for n in list(wanted)}  # and the baselines they are compared with
    names = [n for n in table if n in wanted or n.startswith("plain")]
    for name in names:  # warm-up
        table[name][0](workloads.TimedBatches(w.batches))
    results: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(args.reps):
        for name in names:
            results[name] += workloads.measure(table[name][0], w, 1)
    med = {n: statistics.median(v) for n, v in results.items()}
    print(f"{'scenario':<14}{'ms/batch':>10}{'min-max':>18}{'vs':>14}{'extra ms':>10}{'us/call':>9}")
    report: dict[str, Any] = {}
    for name in names:
        base = table[name][1]
        extra = med[name] - med[base] if name != base else 0.0
        per_call = extra * 1e3 / CALLS_PER_BATCH[name] if name in CALLS_PER_BATCH else None
        lo, hi = min(results[name]), max(results[name])
        print(f"{name:<14}{med[name]:>10.3f}{f'{lo:.3f}-{hi:.3f}':>18}{base:>14}{extra:>+10.3f}"
              f"{'' if per_call is None else f'{per_call:9.2f}'}")
        report[name] = {"median_ms": med[name], "min_ms": lo, "max_ms": hi, "baseline": base,
                        "extra_ms": extra, "us_per_call": per_call, "reps": results[name]}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
