"""D4 barriers: a barrier returns only when every earlier handler has finished."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from tests.dispatch._probes import E, Progress, batch_of, fit, nap, until
from tests.helpers import make_trainer
from trainbus import Callback, Event, LoggerDestination, blocking

pytestmark = pytest.mark.anyio


async def test_d4_batch_end_waits_for_every_handler_of_every_earlier_event() -> None:
    n = 3

    class AsyncTrail(Callback):
        def __init__(self) -> None:
            self.finished: list[tuple[Event, int]] = []

        async def after_forward(self, state: Any, logger: Any) -> None:
            await nap(0.01)
            self.finished.append((E.AFTER_FORWARD, batch_of(state)))

        async def batch_end(self, state: Any, logger: Any) -> None:
            await nap(0.01)
            self.finished.append((E.BATCH_END, batch_of(state)))

    class SyncTrail(Callback):
        def __init__(self) -> None:
            self.finished: list[tuple[Event, int]] = []

        def before_backward(self, state: Any, logger: Any) -> None:
            time.sleep(0.01)
            self.finished.append((E.BEFORE_BACKWARD, batch_of(state)))

        def batch_end(self, state: Any, logger: Any) -> None:
            time.sleep(0.01)
            self.finished.append((E.BATCH_END, batch_of(state)))

    a, s = AsyncTrail(), SyncTrail()
    snapshots: list[tuple[int, list[Any], list[Any]]] = []

    class Check(Callback):
        @blocking  # on the training thread, right after BATCH_END's publish returned
        def batch_checkpoint(self, state: Any, logger: Any) -> None:
            snapshots.append((batch_of(state), list(a.finished), list(s.finished)))

    await fit(make_trainer(n, callbacks=[a, s, Check()]))
    for b, a_done, s_done in snapshots:
        assert a_done == [
            (ev, k + (ev is E.BATCH_END)) for k in range(b) for ev in (E.AFTER_FORWARD, E.BATCH_END)
        ]
        assert s_done == [
            (ev, k + (ev is E.BATCH_END))
            for k in range(b)
            for ev in (E.BEFORE_BACKWARD, E.BATCH_END)
        ]
    assert [b for b, *_ in snapshots] == [1, 2, 3]


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_d4_no_barriers_leaves_only_close(kind: str) -> None:
    progress = Progress()

    class Behind(Callback):
        # Declared trailing: without a barrier nothing but close waits for it. (Without
        # the declaration the live fence would wait for epoch_start before batch 1's
        # gradients are zeroed: tests/dispatch/test_live_fence.py.)
        trailing = 100

        def __init__(self) -> None:
            self.batch_ends: list[int] = []
            self.at_close: list[int] | None = None

        # The first handler waits until the producer published FIT_END: with BATCH_END
        # still a barrier the producer would wait for it at batch 1 (a deadlock).
        if kind == "sync":

            def epoch_start(self, state: Any, logger: Any) -> None:
                progress.wait(lambda p: p.fit_ended)

            def batch_end(self, state: Any, logger: Any) -> None:
                self.batch_ends.append(batch_of(state))

        else:

            async def epoch_start(self, state: Any, logger: Any) -> None:
                await until(lambda: progress.fit_ended, "FIT_END")

            async def batch_end(self, state: Any, logger: Any) -> None:
                self.batch_ends.append(batch_of(state))

        def close(self, state: Any, logger: Any) -> None:
            self.at_close = list(self.batch_ends)

    behind = Behind()
    await fit(make_trainer(4, callbacks=[progress, behind], barriers=()))
    assert behind.at_close == [1, 2, 3, 4]


@pytest.mark.parametrize("max_lag", [1, 2])
async def test_d4_max_lag_lets_handlers_trail_the_barrier_but_not_the_next_compute(
    max_lag: int,
) -> None:
    # Issue 54: max_lag alone lets a handler of batch m trail BATCH_END m (the barrier of
    # batch m waits for batch m - max_lag) across batch m+1's data loading and lead
    # events, never across its compute (the live fence; before this change this test let
    # it trail max_lag whole batches, as a late reader of live gradients crashed the
    # process). Declared @trailing(k) handlers still trail k batches: test_trailing.py.
    n = 6
    progress = Progress()

    class Lagging(Callback):
        def __init__(self) -> None:
            self.ahead: dict[int, tuple[int, int]] = {}

        async def batch_end(self, state: Any, logger: Any) -> None:
            m = batch_of(state)
            # Held until the producer loaded batch m+1 (in lockstep: a deadlock) ...
            await until(
                lambda: progress.started >= m + 1 or progress.fit_ended, "the producer"
            )
            await anyio.sleep(0.02)  # ... and gets room to run further ahead if it ignored us
            self.ahead[m] = (progress.started, progress.batches)

    lagging = Lagging()
    trainer = make_trainer(
        n, callbacks=[progress, lagging], max_lag=max_lag
    )
    await fit(trainer)
    # Batch m+1 started, and it never ended while batch m's handler ran.
    assert lagging.ahead == {m: (min(m + 1, n), m) for m in range(1, n + 1)}


async def test_d4_barriers_sets_the_barrier_events() -> None:
    n = 3
    progress = Progress()

    class Slow(Callback):
        def __init__(self) -> None:
            self.finished: list[tuple[str, int]] = []

        async def batch_start(self, state: Any, logger: Any) -> None:
            await nap(0.01)
            self.finished.append(("start", batch_of(state)))

        async def batch_end(self, state: Any, logger: Any) -> None:
            m = batch_of(state)
            if m < n:  # BATCH_END is no barrier now: the producer starts batch m + 1
                await until(lambda: progress.started > m, "the next batch")
            self.finished.append(("end", m))

    slow = Slow()
    seen: list[tuple[int, list[tuple[str, int]]]] = []

    class Check(Callback):
        @blocking  # the training thread, right after AFTER_FORWARD (the barrier) returned
        def before_loss(self, state: Any, logger: Any) -> None:
            seen.append((batch_of(state), list(slow.finished)))

    trainer = make_trainer(n, callbacks=[progress, slow, Check()], barriers=(E.AFTER_FORWARD,))
    await fit(trainer)
    for b, finished in seen:
        want = [("start", 0)]
        for k in range(1, b + 1):
            want += [("end", k), ("start", k)]
        assert finished == want
    assert [b for b, _ in seen] == [0, 1, 2]


async def test_d4_close_waits_for_every_handler_of_every_callback() -> None:
    class SlowFitEnd(Callback):
        def __init__(self) -> None:
            self.done = False

        async def fit_end(self, state: Any, logger: Any) -> None:
            await nap(0.05)
            self.done = True

    slow = SlowFitEnd()
    saw: list[bool] = []

    class Closer(Callback):
        async def close(self, state: Any, logger: Any) -> None:
            saw.append(slow.done)

    await fit(make_trainer(1, callbacks=[slow, Closer()]))
    assert saw == [True]


async def test_d4_barriers_do_not_wait_for_log_records() -> None:
    """A destination still busy with the loss record of batch 1 does not hold BATCH_END."""
    released = anyio.Event()
    outcome: list[bool] = []

    class Stuck(LoggerDestination):
        async def log_record(self, record: Any) -> None:
            if not outcome:  # the first record waits until training has ended
                with anyio.move_on_after(5) as scope:
                    await released.wait()
                outcome.append(not scope.cancelled_caught)

    class Ends(Callback):
        async def fit_end(self, state: Any, logger: Any) -> None:
            released.set()

    await fit(make_trainer(4, callbacks=[Ends()], loggers=[Stuck()]))
    assert outcome == [True], "a barrier waited for the destination's log record"
