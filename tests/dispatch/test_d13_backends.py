"""D13 backends and entry points: asyncio, trio, fit_sync, plain-code Engine calls."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.dispatch._probes import WATCHDOG, Closes, E, batch_of, expected, fit, nap
from tests.helpers import EventLog, make_trainer
from trainbus import Callback, EngineThreadError, Event


class AsyncLog(Callback):
    def __init__(self) -> None:
        self.events: list[tuple[Event, int]] = []

    async def run_event(self, event: Event, state: Any, logger: Any) -> None:
        await anyio.sleep(0)
        self.events.append((event, batch_of(state)))


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("entry", ["fit_sync", "anyio.run"])
def test_d13_fit_from_a_plain_script(backend: str, entry: str) -> None:
    plain, coro = EventLog(), AsyncLog()
    trainer = make_trainer(2, callbacks=[plain, coro])
    if entry == "fit_sync":
        trainer.fit_sync(backend=backend)  # type: ignore[arg-type]
    else:
        anyio.run(trainer.fit, backend=backend)
    assert plain.events == coro.events == expected(2)
    assert (plain.closed, plain.post_closed) == (1, 1)


def test_d13_engine_run_event_and_close_from_plain_code() -> None:
    class Both(Closes):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[str] = []

        def epoch_start(self, state: Any, logger: Any) -> None:
            self.calls.append("plain")

    class AsyncBoth(Closes):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[str] = []

        async def epoch_start(self, state: Any, logger: Any) -> None:
            await nap(0.01)
            self.calls.append("async")

    plain, coro = Both(), AsyncBoth()
    trainer = make_trainer(1, callbacks=[plain, coro])
    trainer.engine.run_event(Event.EPOCH_START)  # returns once the handlers have run
    assert (plain.calls, coro.calls) == (["plain"], ["async"])
    trainer.engine.run_event("epoch_start")
    assert (plain.calls, coro.calls) == (["plain"] * 2, ["async"] * 2)
    trainer.engine.close()
    trainer.engine.close()  # a no-op
    assert [(cb.closed, cb.post_closed) for cb in (plain, coro)] == [(1, 1), (1, 1)]


@pytest.mark.anyio
async def test_d13_blocking_engine_calls_on_the_loop_thread_refuse_naming_the_fix() -> None:
    log = AsyncLog()
    trainer = make_trainer(1, callbacks=[log])
    with pytest.raises(EngineThreadError, match="arun_event"):
        trainer.engine.run_event(Event.EPOCH_START)
    with pytest.raises(EngineThreadError, match=r"await trainer\.fit\(\)"):
        trainer.fit_sync()
    await trainer.engine.arun_event(Event.EPOCH_START)
    assert log.events == [(E.EPOCH_START, 0)]


@pytest.mark.anyio
async def test_d13_async_handlers_may_suspend_inside_their_own_cancel_scopes() -> None:
    class Scoped(Callback):
        def __init__(self) -> None:
            self.done: list[Event] = []

        async def after_forward(self, state: Any, logger: Any) -> None:
            with anyio.fail_after(WATCHDOG):
                await anyio.sleep(0.001)
            self.done.append(E.AFTER_FORWARD)

        async def after_backward(self, state: Any, logger: Any) -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(anyio.sleep, 0.001)
            self.done.append(E.AFTER_BACKWARD)

        async def batch_end(self, state: Any, logger: Any) -> None:
            await anyio.sleep(0.001)
            self.done.append(E.BATCH_END)

    cb = Scoped()
    await fit(make_trainer(2, callbacks=[cb]))
    assert cb.done == [E.AFTER_FORWARD, E.AFTER_BACKWARD, E.BATCH_END] * 2
