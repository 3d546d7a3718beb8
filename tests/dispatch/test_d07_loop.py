"""D7 never block the loop: plain handlers never run on the loop thread."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import pytest

from tests.dispatch._probes import E, fit
from tests.helpers import make_trainer
from trainbus import Callback, Event

pytestmark = pytest.mark.anyio


async def test_d7_plain_handlers_never_run_on_the_loop_which_stays_responsive() -> None:
    loop_thread = threading.get_ident()
    nap_s = 0.25
    threads: set[int] = set()
    sleeping, woke = threading.Event(), threading.Event()

    def note(self: Any, state: Any, logger: Any) -> None:
        threads.add(threading.get_ident())

    class Plain(Callback):
        def batch_end(self, state: Any, logger: Any) -> None:
            threads.add(threading.get_ident())
            sleeping.set()
            time.sleep(nap_s)
            woke.set()

        def close(self, state: Any, logger: Any) -> None:
            threads.add(threading.get_ident())

    for event in Event:  # fast plain handlers elsewhere: all on its thread, none on the loop
        if event is not E.BATCH_END:
            setattr(Plain, event.value, note)

    class AsyncWithPlainClose(Callback):
        async def batch_end(self, state: Any, logger: Any) -> None:
            await anyio.sleep(0)

        def close(self, state: Any, logger: Any) -> None:
            threads.add(threading.get_ident())

    lateness: list[float] = []
    ticks_while_sleeping = 0

    async def ticker() -> None:
        nonlocal ticks_while_sleeping
        while not woke.is_set():
            t0 = time.perf_counter()
            await anyio.sleep(0.005)
            lateness.append(time.perf_counter() - t0 - 0.005)
            if sleeping.is_set() and not woke.is_set():
                ticks_while_sleeping += 1

    trainer = make_trainer(1, callbacks=[Plain(), AsyncWithPlainClose()])
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await fit(trainer)
    assert loop_thread not in threads
    # A handler run on the loop would delay one tick by ~nap_s and allow ~1 tick in all.
    assert max(lateness) < 0.4 * nap_s
    assert ticks_while_sleeping >= 10


async def test_d7_plain_post_close_never_runs_on_the_loop() -> None:
    loop_thread = threading.get_ident()
    threads: list[int] = []

    class AsyncWithPlainPostClose(Callback):
        async def batch_end(self, state: Any, logger: Any) -> None:
            await anyio.sleep(0)

        def post_close(self) -> None:
            threads.append(threading.get_ident())

    await fit(make_trainer(1, callbacks=[AsyncWithPlainPostClose()]))
    assert threads and loop_thread not in threads
