"""PyTorch-Ignite: per-batch overhead of its Engine and of its event handlers.

``create_supervised_trainer`` (SGD, cross-entropy; its output_transform keeps
the loss tensor, so no ``.item()`` per batch) runs one epoch over the 200
in-memory batches per repetition, a fresh Engine each time. Ignite has no
logging, checkpointing or progress bar unless handlers add them; none are added.
No-op callbacks attach a handler to every per-iteration event
(GET_BATCH_STARTED, GET_BATCH_COMPLETED, ITERATION_STARTED, ITERATION_COMPLETED:
4 calls per batch each); the sleep and upload callbacks use ITERATION_COMPLETED.
Run in its venv:

    benchmarks/.venvs/ignite/bin/python benchmarks/peers/run_ignite.py --scenario a
    benchmarks/.venvs/ignite/bin/python benchmarks/peers/run_ignite.py --serve  # a worker
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ignite
import workloads as wl
from ignite.engine import Engine, Events, create_supervised_trainer

PER_BATCH_EVENTS = (
    Events.GET_BATCH_STARTED, Events.GET_BATCH_COMPLETED,
    Events.ITERATION_STARTED, Events.ITERATION_COMPLETED,
)


def attach(engine: Engine, action: str, url: str | None) -> None:
    """Attach one callback's handlers, the way an Ignite user would."""
    if action == "noop":
        for event in PER_BATCH_EVENTS:
            engine.add_event_handler(event, wl.noop)
    elif action == "sleep":
        engine.add_event_handler(Events.ITERATION_COMPLETED, wl.sleep_5ms)
    else:
        def upload(engine: Engine) -> None:
            wl.post_metrics(url, engine.state.iteration, engine.state.output.item())

        engine.add_event_handler(Events.ITERATION_COMPLETED, upload)


def bench(w: wl.Workload, spec: wl.Scenario, url: str | None, reps: int,
          warmup: int) -> tuple[list[float], list[float], int]:
    """Ignite in ``spec`` (see workloads.Bench)."""
    opt = w.optimizer()

    def fit_epoch(data: wl.TimedBatches) -> None:
        engine = create_supervised_trainer(
            w.model, opt, w.loss_fn, output_transform=lambda x, y, y_pred, loss: loss
        )
        for _ in range(spec.n_callbacks):
            attach(engine, spec.action, url)
        engine.run(data, max_epochs=1)

    setup_ms: list[float] = []
    ms = wl.measure(fit_epoch, w, reps, setup_ms, warmup)
    per_cb = len(PER_BATCH_EVENTS) if spec.action == "noop" else 1
    return ms, setup_ms, spec.n_callbacks * per_cb


def main() -> None:
    wl.run_main(__doc__ or "", "ignite", ignite.__version__, bench)


if __name__ == "__main__":
    main()
