"""D11 cancellation: cancelling fit() stops training, closes and propagates."""

from __future__ import annotations

import math
import threading
from typing import Any

import anyio
import pytest

from tests.dispatch._probes import WATCHDOG, Closes, E, Witness, batch_of, expected, nap, until
from tests.helpers import EventLog, TinyModel, make_trainer
from trainbus import Callback, LoggerDestination, blocking

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("how", ["cancel-scope", "task-group", "fail-after", "move-on-after"])
async def test_d11_cancelling_fit_stops_training_closes_and_propagates(
    how: str, no_leaked_threads: None
) -> None:
    witness, log = Witness(), EventLog()  # log: a plain callback, on a thread lane
    parked = anyio.Event()

    class Hang(Callback):  # all async: a loop lane (plain close: see the test below)
        def __init__(self) -> None:
            self.closed = self.post_closed = 0

        async def batch_end(self, state: Any, logger: Any) -> None:
            await anyio.sleep(0)
            if batch_of(state) == 2:  # the producer waits at this barrier until cancelled
                parked.set()
                await anyio.sleep_forever()

        async def close(self, state: Any, logger: Any) -> None:
            self.closed += 1

        async def post_close(self) -> None:
            self.post_closed += 1

    hang = Hang()
    trainer = make_trainer(5, callbacks=[witness, hang, log])
    returned = False

    async def run_fit() -> None:
        nonlocal returned
        await trainer.fit()
        returned = True

    if how == "task-group":
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_fit)
            await parked.wait()
            tg.cancel_scope.cancel()
    else:
        scopes: list[anyio.CancelScope] = []

        async def expire() -> None:
            await parked.wait()
            if how == "cancel-scope":
                scopes[0].cancel()
            else:
                scopes[0].deadline = anyio.current_time()

        with anyio.fail_after(WATCHDOG):
            async with anyio.create_task_group() as tg:
                tg.start_soon(expire)
                if how == "fail-after":
                    with pytest.raises(TimeoutError):
                        with anyio.fail_after(math.inf) as scope:
                            scopes.append(scope)
                            await run_fit()
                else:
                    with (
                        anyio.CancelScope()
                        if how == "cancel-scope"
                        else anyio.move_on_after(math.inf) as scope
                    ):
                        scopes.append(scope)
                        await run_fit()
                    assert scope.cancelled_caught
    assert not returned  # the cancellation propagated out of fit()
    assert witness.events == expected(5)[: expected(5).index((E.BATCH_END, 2)) + 1]
    assert (hang.closed, hang.post_closed, log.closed, log.post_closed) == (1, 1, 1, 1)


async def test_d11_cancel_while_training_runs_stops_the_training_thread(
    no_leaked_threads: None,
) -> None:
    n = 500
    started = threading.Event()

    class Signal(Closes):
        @blocking
        def after_forward(self, state: Any, logger: Any) -> None:
            if batch_of(state) == 3:
                started.set()

    signal, log = Signal(), EventLog()
    trainer = make_trainer(
        n,
        callbacks=[signal, log],
        model=TinyModel(delay=0.002),
        barriers=(),
    )
    with anyio.move_on_after(WATCHDOG) as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(trainer.fit)
            await until(started.is_set, "batch 3")
            tg.cancel_scope.cancel()
    assert not scope.cancelled_caught
    assert int(trainer.state.timer.batch) < n
    assert E.FIT_END not in log.names
    assert (signal.closed, signal.post_closed, log.closed) == (1, 1, 1)


async def test_d11_cancel_reaches_async_handlers_of_callbacks_with_plain_ones_too() -> None:
    started = anyio.Event()
    completed: list[bool] = []

    class Mixed(Callback):
        def batch_start(self, state: Any, logger: Any) -> None:
            pass

        async def batch_end(self, state: Any, logger: Any) -> None:
            started.set()
            await anyio.sleep(0)
            await anyio.sleep(1.0)  # the cancellation should end this at once
            completed.append(True)

    trainer = make_trainer(3, callbacks=[Mixed()])
    with anyio.fail_after(WATCHDOG):
        async with anyio.create_task_group() as tg:
            tg.start_soon(trainer.fit)
            await started.wait()
            tg.cancel_scope.cancel()
    assert completed == []


async def test_d11_cancellation_does_not_drop_records_already_logged() -> None:
    class SlowSink(LoggerDestination):
        def __init__(self) -> None:
            self.got: list[int] = []
            self.receiving = threading.Event()

        async def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
            self.receiving.set()
            await nap(0.05)
            self.got.append(step)

    class Logs(Callback):
        def __init__(self) -> None:
            self.logged: list[int] = []

        @blocking
        def batch_end(self, state: Any, logger: Any) -> None:
            logger.log_metrics({"x": batch_of(state)})
            self.logged.append(batch_of(state))

    sink, logs = SlowSink(), Logs()
    trainer = make_trainer(
        20, callbacks=[logs], loggers=[sink], log_train_loss=False
    )
    with anyio.fail_after(WATCHDOG):
        async with anyio.create_task_group() as tg:
            tg.start_soon(trainer.fit)
            await until(sink.receiving.is_set, "a delivery")
            tg.cancel_scope.cancel()
    assert logs.logged and sink.got == logs.logged
