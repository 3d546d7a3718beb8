"""Issue 12, observation 1: a stuck ``close`` or plain handler cannot hold ``fit()``.

``with anyio.move_on_after(2): await trainer.fit()`` around a callback whose ``close``
sleeps for an hour (plain), awaits for ever (async), or whose plain ``batch_end`` sleeps
for an hour, with ``close_timeout=1``: ``fit()`` returns, a ``CallbackTimeoutWarning``
names the stuck callback (and only it), every other callback's ``close`` and
``post_close`` ran, the JSON-lines file and the uploader have every logged point, and no
trainbus thread is alive but the stuck one's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.failures._harness import (
    BOUND,
    CloseOrder,
    Probe,
    Sleeps,
    SmallServer,
    closing,
    jsonl_points,
    release_and_join,
    run_bounded,
    server_fixture,
    spooled_points,
    trainbus_threads,
)
from tests.helpers import TinyModel, make_loader
from trainbus import Callback, CallbackTimeoutWarning, LoggerDestination, Trainer
from trainbus.loggers import HTTPMetricsUploader, JSONLinesLogger

BACKENDS = ["asyncio", "trio"]
OTHERS = ["PlainCloser", "AsyncCloser", "RecordingDestination"]


@pytest.fixture
def server() -> Iterator[SmallServer]:
    yield from server_fixture()


class StuckClose(Callback):
    def __init__(self, sleeps: Sleeps, order: CloseOrder) -> None:
        self.sleeps, self.order = sleeps, order

    def close(self, state: Any, logger: Any) -> None:
        self.order.add("close", "StuckClose")
        self.sleeps.hour()

    def post_close(self) -> None:
        self.order.add("post_close", "StuckClose")


class StuckAsyncClose(Callback):
    def __init__(self, sleeps: Sleeps, order: CloseOrder) -> None:
        self.order = order

    async def close(self, state: Any, logger: Any) -> None:
        self.order.add("close", "StuckAsyncClose")
        await anyio.sleep_forever()

    async def post_close(self) -> None:
        self.order.add("post_close", "StuckAsyncClose")


class StuckBatchEnd(Callback):
    def __init__(self, sleeps: Sleeps, order: CloseOrder) -> None:
        self.sleeps, self.order = sleeps, order

    def batch_end(self, state: Any, logger: Any) -> None:
        if int(state.timer.batch) == 3:
            self.sleeps.hour()

    def close(self, state: Any, logger: Any) -> None:
        self.order.add("close", "StuckBatchEnd")

    def post_close(self) -> None:
        self.order.add("post_close", "StuckBatchEnd")


STUCK: dict[str, type[StuckClose | StuckAsyncClose | StuckBatchEnd]] = {
    "sync-close": StuckClose,
    "async-close": StuckAsyncClose,
    "sync-batch_end": StuckBatchEnd,
}


class RecordingDestination(LoggerDestination):
    def __init__(self, order: CloseOrder) -> None:
        self.order = order

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        pass

    def close(self, state: Any, logger: Any) -> None:
        self.order.add("close", "RecordingDestination")

    def post_close(self) -> None:
        self.order.add("post_close", "RecordingDestination")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["sync-close", "async-close", "sync-batch_end"])
def test_cancelled_fit_with_a_stuck_callback_returns_and_closes_the_others(
    where: str, backend: str, tmp_path: Path, server: SmallServer
) -> None:
    sleeps, order = Sleeps(), CloseOrder()
    stuck = STUCK[where](sleeps, order)
    stuck_name = type(stuck).__name__
    probe = Probe()
    jsonl = tmp_path / "metrics.jsonl"
    spool = tmp_path / "spool"
    trainers: list[Trainer] = []

    async def scenario() -> None:
        model = TinyModel(delay=0.002)
        trainer = Trainer(
            model,
            make_loader(50),
            "1000ep",  # never ends by itself: the deadline below ends it
            callbacks=[
                closing("sync", "PlainCloser", order)(),
                stuck,
                closing("async", "AsyncCloser", order)(),
                probe,
            ],
            loggers=[
                RecordingDestination(order),
                JSONLinesLogger(jsonl, flush_seconds=60.0),  # written out only by close
                HTTPMetricsUploader(
                    server.url, spool_dir=spool, flush_seconds=0.05, backoff=0.01,
                    close_timeout=5.0,
                ),
            ],
            close_timeout=1,
        )
        trainers.append(trainer)
        with anyio.move_on_after(2):
            await trainer.fit()

    try:
        with pytest.warns(CallbackTimeoutWarning) as caught:
            outcome = run_bounded(scenario, backend, sleeps=sleeps)
        # A plain handler that was cheap may have been running on the training thread (the
        # inline fast path at a barrier that waits for it anyway): then that thread is the
        # stuck one, and it must be reported as such.
        reported = [str(w.message) for w in caught]
        allow = [f"trainbus-lane-{stuck_name}"]
        if any(m.startswith("the training thread") for m in reported):
            allow.append("trainbus-train")
        alive = trainbus_threads(allow=tuple(allow))
    finally:
        released = release_and_join(sleeps, (f"trainbus-lane-{stuck_name}", "trainbus-train"))

    assert outcome.error is None, repr(outcome.error)  # move_on_after took the cancellation
    assert outcome.elapsed < BOUND  # a safety bound, not a timing claim
    timeouts = [str(w.message) for w in caught if issubclass(w.category, CallbackTimeoutWarning)]
    assert any(stuck_name in message for message in timeouts), timeouts
    for other in [*OTHERS, "Probe", "JSONLinesLogger", "HTTPMetricsUploader"]:
        assert not any(other in message for message in timeouts), timeouts
    order.assert_complete(OTHERS)
    assert probe.logged, "the run logged nothing before the deadline"
    assert Counter(jsonl_points(jsonl)) == Counter(probe.logged)
    assert Counter(server.points()) + Counter(spooled_points(spool)) >= Counter(probe.logged)
    assert not alive, f"trainbus threads alive after fit(): {alive}"
    assert not trainers[0].engine.running
    # An abandoned thread that comes back later ends quietly (its loop is gone by then).
    assert not released, f"released stuck threads raised: {released}"
