"""How many lane threads should plain callbacks share by default? (issue 42)

    python benchmarks/investigations/lane_pool.py [--rounds 3] [--batches 20]

Runs the suite's MLP workload with a ``Trainer`` per fit, ``fit_sync()``, for each case and
pool size (``Trainer(lane_threads=...)``; "each" is one thread per callback, the bus before
the pool), rounds interleaved (the order of the arms rotated each round), and prints the
median ms per batch, its ratio to the plain loop of the same round (no callbacks) with the
min-max over the rounds, and the threads alive during the fit:

- 100 and 1,000 no-op plain callbacks on every per-batch event (the suite's rows (c) and
  its 1,000-callback row);
- 4 callbacks sleeping 5 ms at ``BATCH_END`` (row (d)), where a pool smaller than 4 makes
  them take turns.

Wall clock on a shared machine: read the ratios, not the times, and a spread that covers
a difference means it is not decided.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))

from harness import workload as wl  # noqa: E402
from harness.frameworks.trainbus_fw import QUIET, _Sleeper, noop_class  # noqa: E402

import trainbus  # noqa: E402

CASES = {  # case -> (scenario, callbacks, pool sizes)
    "100 no-op": ("noop", 100, [1, 2, 4, 8, 16, "each"]),
    "1,000 no-op": ("noop", 1000, [4, 8, 16, 32]),
    "4 sleepers": ("sleep", 4, [1, 2, 4, 8]),
}


def fit(w: wl.Workload, scenario: str, n: int, size: Any) -> tuple[float, int]:
    """One fit: ms per batch from the first batch to the end of fit, threads at its peak."""
    peak = [0]

    class Threads(trainbus.Callback):
        @trainbus.blocking
        def batch_end(self, state: Any, logger: Any) -> None:
            peak[0] = max(peak[0], threading.active_count())

    cls = noop_class("noop") if scenario == "noop" else _Sleeper
    callbacks: list[Any] = [cls() for _ in range(n)]
    if size == "each":  # one thread per callback: each asks for its own
        for cb in callbacks:
            cb.own_thread = True
        size = 1
    data = wl.TimedBatches(w.batches)
    trainer = trainbus.Trainer(w.model, data, "1ep", loss_fn=w.loss_fn,
                               optimizers=w.optimizer(), device="cpu", lane_threads=size,
                               callbacks=[*callbacks, Threads()], **QUIET)
    trainer.fit_sync()
    end = time.perf_counter()
    assert data.t_first is not None
    return (end - data.t_first) * 1e3 / len(data), peak[0]


def plain(w: wl.Workload, scenario: str) -> float:
    data = wl.TimedBatches(w.batches)
    opt = w.optimizer()
    for x, y in data:
        opt.zero_grad()
        w.loss_fn(w.model(x), y).backward()
        opt.step()
        if scenario == "sleep":
            time.sleep(0.005)  # the floor of (d): the loop sleeping once a batch
    assert data.t_first is not None
    return (time.perf_counter() - data.t_first) * 1e3 / len(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()
    w = wl.make_workload("mlp", args.batches)
    for case, (scenario, n, sizes) in CASES.items():
        arms: list[Any] = ["plain", *sizes]
        ms: dict[Any, list[float]] = {arm: [] for arm in arms}
        threads: dict[Any, int] = {}
        for r in range(args.rounds):
            shift = r % len(arms)
            for arm in [*arms[shift:], *arms[:shift]]:
                if arm == "plain":
                    ms[arm].append(plain(w, scenario))
                else:
                    t, peak = fit(w, scenario, n, arm)
                    ms[arm].append(t)
                    threads[arm] = peak
        print(f"{case} (plain loop {statistics.median(ms['plain']):.2f} ms a batch)")
        for arm in sizes:
            ratios = [a / b for a, b in zip(ms[arm], ms["plain"], strict=True)]
            print(f"  lane_threads={arm!s:>4}: {statistics.median(ms[arm]):8.2f} ms, "
                  f"{statistics.median(ratios):6.2f}x ({min(ratios):.2f}-{max(ratios):.2f}), "
                  f"{threads[arm]} threads")


if __name__ == "__main__":
    main()
