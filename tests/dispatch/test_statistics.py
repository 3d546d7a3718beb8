"""``engine.statistics()`` after a run."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.dispatch._probes import expected, fit, nap
from tests.helpers import EventLog, make_trainer
from trainbus import Callback
from trainbus.loggers import InMemoryLogger

pytestmark = pytest.mark.anyio


async def test_statistics_after_a_run() -> None:
    n = 4

    class AsyncCount(Callback):
        async def after_forward(self, state: Any, logger: Any) -> None:
            await anyio.sleep(0)

        async def batch_end(self, state: Any, logger: Any) -> None:
            await nap(0.01)  # the producer waits for it at the BATCH_END barrier

    log, memory = EventLog(), InMemoryLogger()
    trainer = make_trainer(
        n, callbacks=[log, AsyncCount()], loggers=[memory], warn_slow_callbacks=False
    )
    await fit(trainer)
    stats = trainer.engine.statistics()
    plain, coro, dest = stats.callbacks
    names = [c.name.rsplit(".", 1)[-1] for c in stats.callbacks]  # class __qualname__s
    assert names == ["EventLog", "AsyncCount", "InMemoryLogger"]
    assert [c.on_thread for c in stats.callbacks] == [True, False, True]
    assert plain.handled == len(log.events) == len(expected(n))
    assert 0 <= plain.inline <= plain.handled
    assert coro.handled == 2 * n
    assert coro.slowest is not None and coro.slowest.endswith("AsyncCount.batch_end")
    assert coro.max_time >= 0.01
    assert coro.total_time >= coro.max_time
    assert dest.handled == len(memory.get_timeseries("loss/train")["step"]) == n
    assert stats.events_published == len(expected(n)) and stats.batches == n
    assert (stats.queue_depth, stats.lag_events, stats.lag_batches) == (0, 0, 0)
    assert all(c.pending == 0 and c.peak_pending >= 0 for c in stats.callbacks)
    assert 1 <= stats.barrier_waits <= n and stats.barrier_wait_time > 0
    assert stats.handler_time == pytest.approx(sum(c.total_time for c in stats.callbacks))

    free = make_trainer(n, callbacks=[AsyncCount()], barriers=(), warn_slow_callbacks=False)
    await fit(free)
    assert free.engine.statistics().barrier_waits == 0
