"""Where a fit with many plain callbacks spends its time, phase by phase (issue 42).

    python benchmarks/investigations/fit_phases.py [--callbacks 100] [--rounds 3]

The suite's rows time a fit from its first batch to ``fit_sync()``'s return, so a cost paid
once per fit (the close) weighs on them as much as a cost paid each batch. This splits one
fit of the suite's MLP workload (100 batches, no-op plain callbacks on every per-batch
event) into: building the ``Trainer``; the median batch after the first ten; the first ten
batches; and from ``FIT_END`` to the return (the drain of the lanes, the closes, the
threads' stop). Each phase is also run with no callbacks, in the same round. Wall clock on
a shared machine: the phases move together with the load; compare the two columns.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))

from harness import workload as wl  # noqa: E402
from harness.frameworks.trainbus_fw import QUIET, noop_class  # noqa: E402

import trainbus  # noqa: E402

BATCHES = 100
PHASES = ("build", "batch (median after 10)", "first 10 batches", "FIT_END to return")


def fit(w: wl.Workload, n: int) -> dict[str, float]:
    """One fit's phases, in ms."""
    starts: list[float] = []
    ended: list[float] = []

    class Marks(trainbus.Callback):
        @trainbus.blocking
        def batch_start(self, state: Any, logger: Any) -> None:
            starts.append(time.perf_counter())

        @trainbus.blocking
        def fit_end(self, state: Any, logger: Any) -> None:
            ended.append(time.perf_counter())

    cls = noop_class("noop")
    t0 = time.perf_counter()
    trainer = trainbus.Trainer(w.model, w.batches, "1ep", loss_fn=w.loss_fn,
                               optimizers=w.optimizer(), device="cpu",
                               callbacks=[*(cls() for _ in range(n)), Marks()], **QUIET)
    built = time.perf_counter()
    trainer.fit_sync()
    end = time.perf_counter()
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    return {
        "build": (built - t0) * 1e3,
        "batch (median after 10)": statistics.median(gaps[10:]) * 1e3,
        "first 10 batches": (starts[10] - starts[0]) * 1e3,
        "FIT_END to return": (end - ended[0]) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callbacks", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    w = wl.make_workload("mlp", BATCHES)
    fit(w, 1)  # warm up torch and the imports
    runs: dict[int, list[dict[str, float]]] = {0: [], args.callbacks: []}
    for r in range(args.rounds):
        for n in (runs if r % 2 == 0 else reversed(list(runs))):
            runs[n].append(fit(w, n))
    print(f"{'phase':>24}  {'no callbacks':>14}  {f'{args.callbacks} callbacks':>14}  (ms)")
    for phase in PHASES:
        cells = [statistics.median(run[phase] for run in runs[n]) for n in runs]
        print(f"{phase:>24}  {cells[0]:14.2f}  {cells[1]:14.2f}")


if __name__ == "__main__":
    main()
