"""D6 close: one cycle per fit(), close once, post_close after every close."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

from tests.dispatch._probes import E, batch_of, expected, fit, nap
from tests.helpers import EventLog, make_trainer
from trainbus import Callback, Event, LoggerDestination


@pytest.mark.anyio
async def test_d6_close_once_per_cycle_post_close_after_all_close_and_fit_continues() -> None:
    stamp = itertools.count()

    class Stamps(Callback):
        def __init__(self) -> None:
            self.close_spans: list[tuple[int, int]] = []
            self.post_at: list[int] = []
            self.events: list[tuple[Event, int]] = []

    class SyncClose(Stamps):
        def run_event(self, event: Event, state: Any, logger: Any) -> None:
            self.events.append((event, batch_of(state)))

        def close(self, state: Any, logger: Any) -> None:
            start = next(stamp)
            time.sleep(0.02)
            self.close_spans.append((start, next(stamp)))

        def post_close(self) -> None:
            self.post_at.append(next(stamp))

    class AsyncClose(Stamps):
        async def close(self, state: Any, logger: Any) -> None:
            start = next(stamp)
            await nap(0.02)
            self.close_spans.append((start, next(stamp)))

        async def post_close(self) -> None:
            self.post_at.append(next(stamp))

    class Destination(LoggerDestination, Stamps):
        def close(self, state: Any, logger: Any) -> None:
            start = next(stamp)
            self.close_spans.append((start, next(stamp)))

        def post_close(self) -> None:
            self.post_at.append(next(stamp))

    cbs: list[Stamps] = [SyncClose(), AsyncClose()]
    dest = Destination()
    trainer = make_trainer(2, callbacks=cbs, loggers=[dest])
    every: list[Stamps] = [*cbs, dest]

    def check(cycles: int) -> None:
        for cb in every:
            assert len(cb.close_spans) == cycles and len(cb.post_at) == cycles, type(cb)
        for c in range(cycles):
            last_close = max(cb.close_spans[c][1] for cb in every)
            assert min(cb.post_at[c] for cb in every) > last_close

    await fit(trainer)
    check(1)
    assert trainer.engine.closed
    await trainer.engine.aclose()  # closing a closed engine is a no-op
    check(1)

    await fit(trainer, duration="1ep")  # a new cycle: FIT_START again, INIT never again
    check(2)
    assert cbs[0].events == expected(2) + expected(2, init=False, start=2)
    assert int(trainer.state.timer.batch) == 4


def test_d6_fit_sync_twice_delivers_init_once_and_close_is_a_no_op_after() -> None:
    log = EventLog()
    trainer = make_trainer(2, callbacks=[log])  # plain code: INIT runs in the constructor
    assert log.names == [E.INIT]
    trainer.fit_sync()
    trainer.fit_sync(duration="1ep")
    assert log.events == expected(2) + expected(2, init=False, start=2)
    assert (log.closed, log.post_closed) == (2, 2)
    trainer.engine.close()
    assert (log.closed, log.post_closed) == (2, 2)


@pytest.mark.anyio
async def test_d6_fit_returns_only_when_no_handler_is_running(no_leaked_threads: None) -> None:
    finished: list[str] = []

    class AsyncStraggler(Callback):
        async def fit_end(self, state: Any, logger: Any) -> None:
            await nap(0.05)
            finished.append("async")

    class SyncStraggler(Callback):
        def batch_checkpoint(self, state: Any, logger: Any) -> None:
            time.sleep(0.005)

        def fit_end(self, state: Any, logger: Any) -> None:
            time.sleep(0.05)
            finished.append("sync")

    trainer = make_trainer(
        3, callbacks=[AsyncStraggler(), SyncStraggler()], barriers=()
    )
    await fit(trainer)
    assert sorted(finished) == ["async", "sync"]
    stats = trainer.engine.statistics()
    assert stats.queue_depth == 0
    assert [c.pending for c in stats.callbacks] == [0, 0]
