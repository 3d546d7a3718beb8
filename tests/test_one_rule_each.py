"""Rules the code once wrote twice, now written once (issue 55's vestiges).

- one ``batch_size_of`` (``training/batch.py``), the Trainer's and ``trainbus.Bus``'s;
- the bus's options validated in one place: ``Engine`` takes a ``BusOptions`` as it is (what
  the Trainer passes) or validates keywords through ``BusOptions.validated``;
- ``FitInProgressError`` raised by the engine alone (the Trainer asks it before a fit).
"""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest
import torch

from tests.helpers import make_trainer
from trainbus import Callback, Engine, Event, FitInProgressError, Logger, State
from trainbus.bus.options import BusOptions
from trainbus.integrations import loop as bus_loop
from trainbus.training import batch, loop


def test_one_batch_size_of_for_every_loop() -> None:
    assert loop.batch_size_of is batch.batch_size_of is bus_loop.batch_size_of
    size = batch.batch_size_of
    assert size(torch.zeros(8, 3)) == 8
    assert size(torch.tensor(1.0)) == 1
    assert size((torch.zeros(5, 2), torch.zeros(5))) == 5
    assert size([[torch.zeros(6)], 1]) == 6
    assert size({"name": "a", "id": 3, "x": torch.zeros(4, 2)}) == 4  # skips to the tensor
    assert size({"ids": [torch.zeros(7)]}) == 7
    assert size("text") == 1 and size(3) == 1 and size(()) == 1


def _state() -> State:
    return State(model=torch.nn.Linear(1, 1), max_duration="1ep")


def test_engine_takes_validated_options_as_they_are() -> None:
    state = _state()
    options = BusOptions.validated(queue_size=7, barriers=())
    engine = Engine(state, Logger(state), [], options=options)
    assert engine.options is options


def test_engine_validates_keywords_through_bus_options() -> None:
    state = _state()
    engine = Engine(state, Logger(state), [], queue_size=3, barriers=("batch_end",))
    assert engine.options == BusOptions.validated(queue_size=3, barriers=(Event.BATCH_END,))
    with pytest.raises(ValueError, match="queue_size=0"):
        Engine(state, Logger(state), [], queue_size=0)
    with pytest.raises(TypeError, match="either as one BusOptions or as keywords"):
        Engine(state, Logger(state), [], options=BusOptions(), queue_size=3)
    with pytest.raises(TypeError, match="must be a BusOptions"):
        Engine(state, Logger(state), [], options={"queue_size": 3})  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_a_second_fit_meanwhile_is_refused_by_the_engine() -> None:
    entered, release = threading.Event(), threading.Event()

    class Hold(Callback):
        def batch_end(self, state: Any, logger: Any) -> None:
            entered.set()
            release.wait(30)

    trainer = make_trainer(1, callbacks=[Hold()])
    async with anyio.create_task_group() as tg:
        tg.start_soon(trainer.fit)
        await anyio.to_thread.run_sync(entered.wait, 30)
        try:
            with pytest.raises(FitInProgressError, match="already fitting"):
                await trainer.fit()
        finally:
            release.set()
    assert int(trainer.state.timer.batch) == 1  # the first fit went on
