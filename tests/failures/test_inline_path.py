"""Issue 12, observation 7: the inline fast path never holds the training thread.

- A plain ``batch_end`` that was cheap twice ran its next, slow call on
  ``trainbus-train`` although ``max_lag=5`` lets it trail: the slow call must run on its
  callback's thread.
- A cheap plain handler, deferred to the training thread, ran only at the next barrier:
  300 ms late when the next event was 300 ms away. It must run while the training thread
  is still busy before its next event (the hold below ends early once it has run; that it
  did not have to wait the whole hold is what is asserted, through events).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.failures._harness import run_bounded
from tests.helpers import TinyModel, make_loader
from trainbus import Callback, Trainer, blocking

BACKENDS = ["asyncio", "trio"]
HOLD = 0.3  # seconds the training thread is busy before its next event


class CheapCheapSlow(Callback):
    """Every third ``batch_end`` call is slow; records the thread each call ran on."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []

    def batch_end(self, state: Any, logger: Any) -> None:
        n = len(self.calls) + 1
        self.calls.append((n, threading.current_thread().name))
        if n % 3 == 0:
            time.sleep(0.05)  # the slow call's work


@pytest.mark.parametrize("backend", BACKENDS)
def test_slow_call_of_a_cheap_handler_never_runs_on_the_training_thread(backend: str) -> None:
    handler = CheapCheapSlow()

    async def scenario() -> None:
        trainer = Trainer(
            TinyModel(), make_loader(12), "1ep", callbacks=[handler], max_lag=5,
            warn_slow_callbacks=False,
        )
        await trainer.fit()

    outcome = run_bounded(scenario, backend)

    assert outcome.error is None, repr(outcome.error)
    assert len(handler.calls) == 12
    slow_on_train = [n for n, thread in handler.calls if n % 3 == 0 and thread == "trainbus-train"]
    assert not slow_on_train, handler.calls


class Ticks:
    """One event per handler call: set by the handler, awaited (bounded) by the hold."""

    def __init__(self, n: int) -> None:
        self.ran = [threading.Event() for _ in range(n + 1)]
        self.calls = 0
        self.in_time: list[bool] = []

    def tick(self) -> None:
        self.calls += 1
        self.ran[self.calls].set()

    def hold(self, n: int) -> None:
        """Keep the training thread busy up to HOLD s, ending early once call n ran."""
        self.in_time.append(self.ran[n].wait(HOLD))


class CheapBeforeForward(Callback):
    def __init__(self, ticks: Ticks) -> None:
        self.ticks = ticks

    def before_forward(self, state: Any, logger: Any) -> None:
        self.ticks.tick()


class HoldingModel(TinyModel):
    """Its training forward is the 300 ms between ``before_forward`` and the next event."""

    def __init__(self, ticks: Ticks) -> None:
        super().__init__()
        self.ticks = ticks

    def forward(self, batch: Any) -> Any:
        out = super().forward(batch)
        if self.training:
            self.ticks.hold(self.training_forwards)
        return out


class CheapAfterForward(Callback):
    def __init__(self, ticks: Ticks) -> None:
        self.ticks = ticks

    def after_forward(self, state: Any, logger: Any) -> None:
        self.ticks.tick()


class HoldBeforeLoss(Callback):
    """A ``@blocking`` handler: the training thread runs it and is held by it."""

    def __init__(self, ticks: Ticks) -> None:
        self.ticks = ticks
        self.n = 0

    @blocking
    def before_loss(self, state: Any, logger: Any) -> None:
        self.n += 1
        self.ticks.hold(self.n)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hold", ["model-forward", "blocking-handler"])
def test_deferred_cheap_handler_runs_before_the_next_event_comes(hold: str, backend: str) -> None:
    batches = 6
    ticks = Ticks(batches)
    if hold == "model-forward":
        model: TinyModel = HoldingModel(ticks)
        callbacks: list[Callback] = [CheapBeforeForward(ticks)]
    else:
        model = TinyModel()
        callbacks = [CheapAfterForward(ticks), HoldBeforeLoss(ticks)]

    async def scenario() -> None:
        trainer = Trainer(
            model, make_loader(batches), "1ep", callbacks=callbacks, warn_slow_callbacks=False
        )
        await trainer.fit()

    outcome = run_bounded(scenario, backend)

    assert outcome.error is None, repr(outcome.error)
    assert ticks.calls == batches
    # Every call, the deferred ones (after the first measured cheap) included, ran while
    # the training thread was still held before the next event.
    assert ticks.in_time == [True] * batches, ticks.in_time
