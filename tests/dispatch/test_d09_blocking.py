"""D9 blocking handlers: ``@blocking`` runs before the training thread goes on."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
import torch

from tests.dispatch._probes import E, batch_of, expected, fit, nap
from tests.helpers import EventLog, TinyModel, make_trainer
from trainbus import Callback, blocking

pytestmark = pytest.mark.anyio


class FlagModel(TinyModel):
    """The training thread records ``flag`` when it computes each loss, then clears it."""

    def __init__(self) -> None:
        super().__init__()
        self.flag = False
        self.flags_seen: list[bool] = []

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        self.flags_seen.append(self.flag)
        self.flag = False
        return super().loss(outputs, batch)


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_d9_blocking_handlers_run_before_the_training_thread_continues(kind: str) -> None:
    model = FlagModel()

    def zero_grads(state: Any) -> None:
        for p in state.model.parameters():
            assert p.grad is not None
            p.grad.zero_()  # gradient surgery: the optimizer step then changes nothing

    class Lockstep(Callback):
        if kind == "sync":

            @blocking
            def after_forward(self, state: Any, logger: Any) -> None:
                time.sleep(0.005)
                model.flag = True

            @blocking
            def after_backward(self, state: Any, logger: Any) -> None:
                time.sleep(0.005)
                zero_grads(state)

        else:

            @blocking
            async def after_forward(self, state: Any, logger: Any) -> None:
                await nap(0.005)
                model.flag = True

            @blocking
            async def after_backward(self, state: Any, logger: Any) -> None:
                await nap(0.005)
                zero_grads(state)

    before = [p.detach().clone() for p in model.parameters()]
    await fit(make_trainer(3, callbacks=[Lockstep()], model=model))
    assert model.flags_seen == [True, True, True]
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))

    control = TinyModel()  # the same training without the surgery does change the weights
    await fit(make_trainer(3, model=control))
    assert not all(torch.equal(b, p) for b, p in zip(before, control.parameters(), strict=True))


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_d9_blocking_handler_runs_after_its_lanes_backlog(kind: str) -> None:
    class Backlog(Callback):
        def __init__(self) -> None:
            self.finished: list[int] = []
            self.seen: list[list[int]] = []

        async def before_backward(self, state: Any, logger: Any) -> None:
            await nap(0.01)
            self.finished.append(batch_of(state))

        if kind == "sync":

            @blocking
            def after_backward(self, state: Any, logger: Any) -> None:
                self.seen.append(list(self.finished))

        else:

            @blocking
            async def after_backward(self, state: Any, logger: Any) -> None:
                self.seen.append(list(self.finished))

    cb = Backlog()
    await fit(make_trainer(3, callbacks=[cb]))
    assert cb.seen == [[0], [0, 1], [0, 1, 2]]


async def test_d9_stop_training_takes_effect_at_the_next_batch_boundary() -> None:
    class Stopper(Callback):
        async def after_forward(self, state: Any, logger: Any) -> None:
            await anyio.sleep(0)
            if batch_of(state) == 1:
                state.stop_training()

    log = EventLog()
    trainer = make_trainer(5, callbacks=[Stopper(), log])
    await fit(trainer)
    assert int(trainer.state.timer.batch) == 2
    assert log.names[-3:] == [E.BATCH_END, E.BATCH_CHECKPOINT, E.FIT_END]
    assert log.events == [*expected(5)[: 2 + 2 * 12 + 1], (E.FIT_END, 2)]
    assert log.closed == 1
