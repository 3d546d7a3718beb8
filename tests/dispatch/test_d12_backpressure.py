"""D12 backpressure: at most ``queue_size`` pending calls per callback."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest

from tests.dispatch._probes import WATCHDOG, batch_of, expected, until
from tests.helpers import make_trainer
from trainbus import Callback, Event, blocking
from trainbus.core.trailing import LIVE_TENSOR_EVENTS

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("queue_size", [1, 4, None], ids=["q1", "q4", "default"])
async def test_d12_producer_waits_once_a_callback_has_queue_size_pending(
    kind: str, queue_size: int | None
) -> None:
    bound = 128 if queue_size is None else queue_size
    # Stuck holds its queue past batches: it is declared trailing (the live fence would
    # otherwise stop the producer at the next batch's start, issue 54), so it handles the
    # events a trailing handler may (not AFTER_FORWARD ... AFTER_TRAIN_BATCH).
    handled = [event for event in Event if event not in LIVE_TENSOR_EVENTS]
    per_batch = sum(event in handled for event, _ in expected(2)) - sum(
        event in handled for event, _ in expected(1)
    )
    n = bound // per_batch + 2  # enough batches to fill the queue
    release = threading.Event()
    published = 0
    pending_seen: list[int] = []

    class Ahead(Callback):  # lockstep, offered each event first: what was published
        @blocking
        def run_event(self, event: Event, state: Any, logger: Any) -> None:
            nonlocal published
            if event in handled:
                published += 1

    class Stuck(Callback):  # its first handler blocks until the test releases it
        trailing = 10_000

        def __init__(self) -> None:
            self.events: list[tuple[Event, int]] = []
            for event in handled:
                setattr(self, event.value, self.handler(event))

        def handler(self, event: Event) -> Any:
            if kind == "sync":

                def plain(state: Any, logger: Any) -> None:
                    if not self.events:
                        assert release.wait(WATCHDOG / 2)
                    self.events.append((event, batch_of(state)))

                return plain

            async def coroutine(state: Any, logger: Any) -> None:
                if not self.events:
                    await until(release.is_set, "the release")
                self.events.append((event, batch_of(state)))

            return coroutine

    stuck = Stuck()

    class Behind(Callback):  # lockstep, offered each event after Stuck: its pending calls
        @blocking
        def run_event(self, event: Event, state: Any, logger: Any) -> None:
            if event in handled:
                pending_seen.append(trainer.engine.statistics().callbacks[1].pending)

    kw = {} if queue_size is None else {"queue_size": queue_size}
    trainer = make_trainer(n, callbacks=[Ahead(), stuck, Behind()], barriers=(), **kw)
    with anyio.fail_after(WATCHDOG):
        async with anyio.create_task_group() as tg:
            tg.start_soon(trainer.fit)
            await until(lambda: published > bound, "the queue to fill")
            await anyio.sleep(0.05)  # room for a producer that does not wait to go on
            stalled_at = published
            release.set()
    assert stalled_at == bound + 1  # publication bound + 1 waits for a free place
    assert max(pending_seen) == bound
    assert stuck.events == [(e, b) for e, b in expected(n) if e in handled]  # nothing dropped
    stats = trainer.engine.statistics()
    assert stats.callbacks[1].peak_pending == bound
    assert stats.backpressure_wait_time > 0
