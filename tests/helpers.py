"""Small real models and data for tests: fast on CPU, deterministic."""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from trainbus import Callback, Event, Trainer


class TinyModel(torch.nn.Module):
    """A Composer-style model: ``forward(batch)`` and ``loss(outputs, batch)``."""

    def __init__(self, n_in: int = 4, n_out: int = 3, delay: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(n_in, n_out)
        self.delay = delay
        self.forward_threads: set[int] = set()
        self.training_forwards = 0

    def forward(self, batch: Any) -> torch.Tensor:
        x, _ = batch
        if self.training:
            self.training_forwards += 1
        self.forward_threads.add(threading.get_ident())
        if self.delay:
            time.sleep(self.delay)
        return self.lin(x)

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        _, y = batch
        return torch.nn.functional.cross_entropy(outputs, y)


def make_loader(n_batches: int, batch_size: int = 4, seed: int = 0, n_in: int = 4) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_batches * batch_size, n_in, generator=g)
    y = torch.randint(0, 3, (n_batches * batch_size,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False)


def make_trainer(
    n_batches: int = 2,
    epochs: int = 1,
    callbacks: Any = (),
    *,
    model: torch.nn.Module | None = None,
    eval_batches: int = 0,
    **kw: Any,
) -> Trainer:
    model = model if model is not None else TinyModel()
    kw.setdefault("max_duration", f"{epochs}ep")
    return Trainer(
        model=model,
        train_dataloader=make_loader(n_batches),
        eval_dataloader=make_loader(eval_batches, seed=1) if eval_batches else None,
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        callbacks=list(callbacks),
        **kw,
    )


class EventLog(Callback):
    """Records ``(event, batch)`` of every event it sees, plus close/post_close counts."""

    def __init__(self) -> None:
        self.events: list[tuple[Event, int]] = []
        self.closed = 0
        self.post_closed = 0

    def run_event(self, event: Event, state: Any, logger: Any) -> None:
        self.events.append((event, int(state.timer.batch)))

    def close(self, state: Any, logger: Any) -> None:
        self.closed += 1

    def post_close(self) -> None:
        self.post_closed += 1

    @property
    def names(self) -> list[Event]:
        return [e for e, _ in self.events]
