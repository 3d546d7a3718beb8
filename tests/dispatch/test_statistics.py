"""``engine.statistics()`` after a run."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import pytest

from tests.dispatch._probes import expected, fit, nap
from tests.helpers import EventLog, make_trainer
from trainbus import Callback, blocking, trailing
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
        n, callbacks=[log, AsyncCount()], loggers=[memory]
    )
    await fit(trainer)
    stats = trainer.engine.statistics()
    plain, coro, dest = stats.callbacks
    names = [c.name.rsplit(".", 1)[-1] for c in stats.callbacks]  # class __qualname__s
    assert names == ["EventLog", "AsyncCount", "InMemoryLogger"]
    assert [c.on_thread for c in stats.callbacks] == [True, False, True]
    assert plain.handled == len(log.events) == len(expected(n))
    assert plain.inline == 0  # plain handlers never run on the training thread (D7)
    assert coro.handled == 2 * n
    assert coro.slowest is not None and coro.slowest.endswith("AsyncCount.batch_end")
    assert coro.max_time >= 0.01
    assert coro.total_time >= coro.max_time
    assert dest.handled == len(memory.get_timeseries("loss/train")["step"]) == n
    assert stats.events_published == len(expected(n)) and stats.batches == n
    assert (stats.queue_depth, stats.lag_events, stats.lag_batches) == (0, 0, 0)
    assert all(c.pending == 0 and c.peak_pending >= 0 for c in stats.callbacks)
    # At most one wait per batch at its barrier, and one at the live fence before the next
    # batch's compute (for EventLog's handlers of BATCH_CHECKPOINT, EPOCH_START: issue 54).
    assert 1 <= stats.barrier_waits <= 2 * n and stats.barrier_wait_time > 0
    assert stats.handler_time == pytest.approx(sum(c.total_time for c in stats.callbacks))

    fenced = make_trainer(n, callbacks=[AsyncCount()], barriers=())
    await fit(fenced)  # no barrier: only the live fence waits, at most once a batch
    assert fenced.engine.statistics().barrier_waits <= n

    class Trailing(Callback):  # declared @trailing: nothing but close waits for it
        @trailing(1000)
        async def batch_end(self, state: Any, logger: Any) -> None:
            await nap(0.01)

    free = make_trainer(n, callbacks=[Trailing()], barriers=())
    await fit(free)
    assert free.engine.statistics().barrier_waits == 0


def test_per_callback_lag_and_the_barrier_wait_it_caused() -> None:
    """Each callback's own ``lag_batches`` (how far it trails now) and
    ``barrier_wait_caused`` (the waits it ended) — not only the bus-wide maximum."""
    release = threading.Event()
    seen: list[Any] = []

    class Trailer(Callback):
        trailing = 2

        async def batch_end(self, state: Any, logger: Any) -> None:
            if int(state.timer.batch) == 1:  # stuck until the watcher has looked
                await anyio.to_thread.run_sync(release.wait)

    class Slow(Callback):
        def batch_end(self, state: Any, logger: Any) -> None:
            time.sleep(0.005)  # its work: the barrier waits for it every batch
            if int(state.timer.batch) == 3:
                release.wait()  # in flight while the watcher looks

    class Watcher(Callback):
        @blocking
        def batch_end(self, state: Any, logger: Any) -> None:
            if int(state.timer.batch) == 3:
                seen.append(trainer.engine.statistics())
                release.set()

    trainer = make_trainer(5, callbacks=[Trailer(), Slow(), Watcher()])
    trainer.fit_sync()
    trailer, slow, watcher = seen[0].callbacks
    # It finished none of the three batches published so far (stuck in the first).
    assert trailer.lag_batches == 3 and trailer.pending == 3 and trailer.handled == 0, trailer
    assert slow.lag_batches == 1 and slow.pending == 1  # this batch's call, in flight
    assert watcher.lag_batches == 0 and watcher.pending == 0
    final = trainer.engine.statistics().callbacks
    assert final[1].barrier_wait_caused > 0  # the slow one ended the barrier waits
    assert final[2].barrier_wait_caused == 0  # a @blocking handler never makes it wait
    total = sum(c.barrier_wait_caused for c in final)
    stats = trainer.engine.statistics()
    assert total <= stats.barrier_wait_time + stats.backpressure_wait_time + 1e-9


def test_every_call_of_an_all_blocking_callback_counts_as_inline() -> None:
    """A callback whose handlers are all plain ``@blocking`` has each of them run on the
    training thread (D9); ``inline`` says so, though its hot path counts only the calls.
    A callback mixing in a queued handler reports only what ran there."""

    class Lockstep(Callback):
        @blocking
        def after_backward(self, state: Any, logger: Any) -> None:
            pass

        @blocking
        def batch_end(self, state: Any, logger: Any) -> None:
            pass

    class Mixed(Callback):
        @blocking
        def after_backward(self, state: Any, logger: Any) -> None:
            pass

        async def batch_end(self, state: Any, logger: Any) -> None:
            await anyio.sleep(0)  # suspends: always on the loop

    n = 3
    trainer = make_trainer(n, callbacks=[Lockstep(), Mixed()])
    trainer.fit_sync()
    lockstep, mixed = trainer.engine.statistics().callbacks
    assert lockstep.handled == lockstep.inline == 2 * n
    assert mixed.handled == 2 * n and mixed.inline == n


def test_a_blocking_handler_s_time_reaches_the_statistics_and_the_timeline() -> None:
    """The training thread accounts its own ``@blocking`` calls (``Producer._run_here``)
    as runners account queued ones: calls, total and longest time, a span on the
    callback's row of the timeline, recorded on the training thread."""

    class Lockstep(Callback):
        @blocking
        def after_backward(self, state: Any, logger: Any) -> None:
            time.sleep(0.01 if int(state.timestamp.batch) == 1 else 0.002)

    class Queued(Callback):
        def after_backward(self, state: Any, logger: Any) -> None:
            time.sleep(0.002)

    n = 3
    trainer = make_trainer(n, callbacks=[Lockstep(), Queued()])
    recorder = trainer.engine.record_trace()
    trainer.fit_sync()
    lockstep, queued = trainer.engine.statistics().callbacks
    assert lockstep.handled == lockstep.inline == n
    assert lockstep.total_time >= 0.01 + 0.002 * (n - 1)
    assert 0.01 <= lockstep.max_time < lockstep.total_time
    assert queued.handled == n and queued.inline == 0 and queued.total_time >= 0.002 * n
    spans = [s for s in recorder.spans() if s.label == "after_backward"]
    rows = {s.row: [] for s in spans}
    for s in spans:
        rows[s.row].append(s)
    lock_row = next(r for r in rows if "Lockstep" in r)
    assert len(rows[lock_row]) == n and max(s.duration for s in rows[lock_row]) >= 0.01
    train_threads = {s.thread for s in rows[lock_row]}
    queued_row = next(r for r in rows if "Queued" in r)
    assert len(rows[queued_row]) == n
    assert train_threads.isdisjoint({s.thread for s in rows[queued_row]})
