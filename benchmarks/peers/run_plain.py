"""Plain PyTorch loop: the baseline every framework's overhead is measured against.

A hand-written loop (zero_grad, forward, loss, backward, step) over the 200
in-memory batches; callbacks are plain objects whose methods the loop calls at
the 12 per-batch points of Composer's loop (workloads.PER_BATCH_POINTS).
Scenario a runs the bare loop, no dispatch at all. Besides a-e it runs d1, one
5 ms sleep per batch: the honest baseline for hiding d's sleeps (SPEC section 7).
Needs only torch, so it runs on the project's own Python:

    python benchmarks/peers/run_plain.py --scenario a --reps 15 --json out.json
    python benchmarks/peers/run_plain.py --serve    # a worker for run_all_peers.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import workloads as wl


class NoOp:
    """Defines one plain function per per-batch point, each doing nothing."""


for _point in wl.PER_BATCH_POINTS:
    setattr(NoOp, _point, lambda self, state: None)


class Sleeper:
    def batch_end(self, state: object) -> None:
        wl.sleep_5ms()


class Uploader:
    def __init__(self, url: str) -> None:
        self.url = url

    def batch_end(self, state: object) -> None:
        wl.post_metrics(self.url, state.step, state.loss.item())  # type: ignore[attr-defined]


def bench(w: wl.Workload, spec: wl.Scenario, url: str | None, reps: int,
          warmup: int) -> tuple[list[float], list[float], int]:
    """The plain loop in ``spec`` (see workloads.Bench)."""
    factory = {"noop": NoOp, "sleep": Sleeper, "upload": lambda: Uploader(url)}[spec.action]
    callbacks = [factory() for _ in range(spec.n_callbacks)]
    hooks = {
        point: [getattr(cb, point) for cb in callbacks if hasattr(cb, point)]
        for point in wl.PER_BATCH_POINTS
    }
    calls = sum(len(fns) for fns in hooks.values())
    opt = w.optimizer()
    setup_ms: list[float] = []
    ms = wl.measure(lambda data: wl.plain_fit(w, data, opt, hooks if calls else None),
                    w, reps, setup_ms, warmup)
    return ms, setup_ms, calls


def main() -> None:
    wl.run_main(__doc__ or "", "plain", torch.__version__, bench, wl.PLAIN_SCENARIOS)


if __name__ == "__main__":
    main()
