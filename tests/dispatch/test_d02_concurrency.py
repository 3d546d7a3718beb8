"""D2 cross-callback concurrency: handlers of different callbacks run at once."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest

from tests.dispatch._probes import WATCHDOG, batch_of, fit
from tests.helpers import make_trainer
from trainbus import Callback


@pytest.mark.anyio
async def test_d2_async_handlers_of_eight_callbacks_are_all_inside_at_once() -> None:
    n = 8
    arrived: dict[int, int] = {}
    gates: dict[int, anyio.Event] = {}

    class Meet(Callback):
        async def batch_end(self, state: Any, logger: Any) -> None:
            b = batch_of(state)
            gate = gates.setdefault(b, anyio.Event())
            arrived[b] = arrived.get(b, 0) + 1
            if arrived[b] == n:
                gate.set()
            await gate.wait()  # returns only once all n handlers of this batch are inside

    await fit(make_trainer(2, callbacks=[Meet() for _ in range(n)]))
    assert arrived == {1: n, 2: n}


def test_d2_plain_handlers_of_eight_callbacks_are_all_inside_at_once() -> None:
    meeting = threading.Barrier(8, timeout=WATCHDOG / 2)  # BrokenBarrierError if sequential
    met: list[int] = []

    class Meet(Callback):
        def batch_end(self, state: Any, logger: Any) -> None:
            meeting.wait()
            met.append(batch_of(state))

    # One batch: every plain handler is inside at once, on its own pool thread (D2).
    make_trainer(1, callbacks=[Meet() for _ in range(8)]).fit_sync()
    assert met == [1] * 8


@pytest.mark.anyio
async def test_d2_plain_handlers_run_beside_the_async_handlers_of_their_event() -> None:
    partners = 3
    arrived = [threading.Event() for _ in range(partners)]
    waited: list[bool] = []

    class Waits(Callback):  # at batch 2 it waits for its partner's async handler
        def __init__(self, i: int) -> None:
            self.i = i

        def batch_end(self, state: Any, logger: Any) -> None:
            if batch_of(state) == 2:
                waited.append(arrived[self.i].wait(0.5))

    class Partner(Callback):
        def __init__(self, i: int) -> None:
            self.i = i

        async def batch_end(self, state: Any, logger: Any) -> None:
            if batch_of(state) == 2:
                arrived[self.i].set()

    cbs: list[Callback] = [Waits(i) for i in range(partners)]
    cbs += [Partner(i) for i in range(partners)]
    await fit(make_trainer(2, callbacks=cbs))
    assert waited == [True] * partners
