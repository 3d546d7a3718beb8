"""Issue 12, observation 4: records logged from handlers count against ``queue_size``.

A destination taking ~10 ms per record and a callback logging 5 records per batch built
an unbounded backlog (22,706 records, +120 MB) that ``statistics()`` did not even show.
D12: what waits for a destination is bounded by ``queue_size``, records included; the
logging handler waits for room (as publishing does), and the statistics show the records.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import anyio
import pytest

from tests.failures._harness import run_bounded
from tests.helpers import TinyModel, make_loader
from trainbus import Callback, LoggerDestination, Trainer

QUEUE_SIZE = 8
BATCHES = 20
PER_BATCH = 5


class Counts:
    """Records accepted by ``log_metrics`` minus records a destination has started on."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.logged = 0
        self.delivered = 0
        self.backlog: list[int] = []


class FiveRecords(Callback):
    """Logs five records per batch, each counted once ``log_metrics`` has accepted it."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts

    def batch_end(self, state: Any, logger: Any) -> None:
        for i in range(PER_BATCH):
            logger.log_metrics({f"m{i}": 1.0})
            with self.counts.lock:
                self.counts.logged += 1


class SlowDestination(LoggerDestination):
    """Takes ~10 ms per record (the work a slow sink does); samples the backlog."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts
        self.records = 0

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        with self.counts.lock:
            self.counts.delivered += 1
            self.counts.backlog.append(self.counts.logged - self.counts.delivered)
        self.records += 1
        time.sleep(0.01)  # the destination's work, not a synchronisation


def _train(callbacks: list[Callback], loggers: list[LoggerDestination], backend: str) -> Trainer:
    """Train ``BATCHES`` batches with these callbacks and loggers; fail on an error or a hang."""
    trainer = Trainer(
        TinyModel(),
        make_loader(BATCHES),
        "1ep",
        callbacks=callbacks,
        loggers=loggers,
        queue_size=QUEUE_SIZE,
        log_train_loss=False,
    )
    outcome = run_bounded(trainer.fit, backend)
    assert outcome.error is None, repr(outcome.error)
    return trainer


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_records_logged_from_handlers_are_bounded_by_queue_size(backend: str) -> None:
    counts = Counts()
    destination = SlowDestination(counts)
    trainer = _train([FiveRecords(counts)], [destination], backend)

    assert destination.records == BATCHES * PER_BATCH  # nothing dropped
    # The backlog seen by the destination (accepted, not yet started) stays within the
    # bound; without D12 for records it grows to nearly every record of the run (~95).
    assert max(counts.backlog) <= QUEUE_SIZE + 1, max(counts.backlog)
    (stats,) = [c for c in trainer.engine.statistics().callbacks
                if c.name == "SlowDestination"]
    assert stats.handled >= BATCHES * PER_BATCH
    # The records were queued for it, so the statistics show them: peak_pending was 0.
    # (A separate peak counter for records, e.g. ``peak_records``, would do as well.)
    peaks = {f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)
             if f.name.startswith("peak")}
    assert any(0 < peak <= QUEUE_SIZE + 1 for peak in peaks.values()), stats


class FiveRecordsAsync(Callback):
    """As :class:`FiveRecords`, from an ``async def`` handler on the event loop."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts

    async def batch_end(self, state: Any, logger: Any) -> None:
        for i in range(PER_BATCH):
            logger.log_metrics({f"m{i}": 1.0})
            with self.counts.lock:
                self.counts.logged += 1


class SlowAsyncDestination(LoggerDestination):
    """A destination on the loop taking ~10 ms per record; samples the backlog."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts
        self.records = 0

    async def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        with self.counts.lock:
            self.counts.delivered += 1
            self.counts.backlog.append(self.counts.logged - self.counts.delivered)
        self.records += 1
        await anyio.sleep(0.01)  # the destination's work, not a synchronisation


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("sink", [SlowDestination, SlowAsyncDestination])
def test_records_logged_from_async_handlers_are_bounded_by_queue_size(
    backend: str, sink: type[LoggerDestination]
) -> None:
    """An ``async def`` handler cannot block the loop: its lane pauses after the handler
    until the destination has room, so the backlog overshoots by at most one call's
    records (it grew to nearly every record of the run before)."""
    counts = Counts()
    destination = sink(counts)  # type: ignore[call-arg]
    trainer = _train([FiveRecordsAsync(counts)], [destination], backend)

    assert destination.records == BATCHES * PER_BATCH  # type: ignore[attr-defined]
    assert max(counts.backlog) <= QUEUE_SIZE + PER_BATCH, max(counts.backlog)
    (stats,) = [c for c in trainer.engine.statistics().callbacks
                if c.name == sink.__name__]
    assert 0 < stats.peak_pending_records <= QUEUE_SIZE + PER_BATCH, stats


class EchoingDestination(LoggerDestination):
    """A slow destination on the loop whose ``batch_end`` logs records too: two of them
    wait for room in each other, a cycle the bus must not wait on for ever."""

    def __init__(self) -> None:
        self.records = 0

    async def batch_end(self, state: Any, logger: Any) -> None:
        for i in range(PER_BATCH):
            logger.log_metrics({f"{type(self).__name__}{id(self)}/{i}": 1.0})

    async def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        self.records += 1
        await anyio.sleep(0.002)  # the destination's work


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_destinations_logging_into_each_other_do_not_deadlock(backend: str) -> None:
    first, second = EchoingDestination(), EchoingDestination()
    _train([], [first, second], backend)

    assert first.records == second.records == 2 * BATCHES * PER_BATCH  # nothing dropped
