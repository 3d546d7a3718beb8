"""PyTorch-Ignite: ``create_supervised_trainer``, no-op handlers on its 4 per-iteration events."""

from __future__ import annotations

from typing import Any

import ignite
from ignite.engine import Engine, Events, create_supervised_trainer

from harness import workload as wl

NAME = "ignite"
VERSION = f"pytorch-ignite {ignite.__version__}"
PER_BATCH_EVENTS = (Events.GET_BATCH_STARTED, Events.GET_BATCH_COMPLETED,
                    Events.ITERATION_STARTED, Events.ITERATION_COMPLETED)


def _attach(engine: Engine, scenario: str, url: str | None) -> None:
    if scenario == "noop":
        for event in PER_BATCH_EVENTS:
            engine.add_event_handler(event, wl.noop)
    elif scenario == "sleep":
        engine.add_event_handler(Events.ITERATION_COMPLETED, wl.sleep_5ms)
    else:
        def upload(engine: Engine) -> None:
            wl.post_metrics(url, engine.state.iteration, engine.state.output.item())

        engine.add_event_handler(Events.ITERATION_COMPLETED, upload)


def make_fit(w: wl.Workload, scenario: str, n: int, url: str | None) -> tuple[Any, int]:
    if scenario not in ("noop", "sleep", "upload"):
        raise ValueError(f"ignite has no scenario {scenario!r}")
    opt = w.optimizer()

    def fit(data: Any) -> None:
        engine = create_supervised_trainer(
            w.model, opt, w.loss_fn, output_transform=lambda x, y, y_pred, loss: loss)
        for _ in range(n):
            _attach(engine, scenario, url)
        engine.run(data, max_epochs=1)

    return fit, n * (len(PER_BATCH_EVENTS) if scenario == "noop" else 1)
