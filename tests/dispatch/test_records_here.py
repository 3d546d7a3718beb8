"""Records of a cheap plain destination run on the training thread, in bursts.

A destination whose plain ``log_record`` takes a few microseconds (a batching logger that
only queues, a console that formats) would otherwise cost a wake-up of its thread, and the
GIL hand-offs with it, per burst of records. Once its calls on its own thread have shown it
cheap, the training thread runs its bursts itself (``InlinePath.run_records``), in order,
and never a record whose GPU value is not ready yet (D14). A slow one stays on its thread.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from tests.dispatch._probes import WATCHDOG
from tests.dispatch.test_wakeups import count_thread_wakes
from trainbus import Callback, Engine, Event, Logger, LoggerDestination, State
from trainbus.core.scalars import _HOST_COPY_ATTR, DeferredScalar

pytestmark = pytest.mark.anyio

E = Event


class Sink(LoggerDestination):
    """A cheap plain destination noting each record's step and the thread it ran on."""

    def __init__(self, cost: float = 0.0) -> None:
        self.cost = cost
        self.steps: list[int] = []
        self.threads: list[int] = []
        self.got = threading.Event()

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        if self.cost:
            time.sleep(self.cost)
        self.steps.append(step)
        self.threads.append(threading.get_ident())
        self.got.set()


def make_engine(callbacks: list[Callback]) -> Engine:
    state = State(model=torch.nn.Linear(1, 1), max_duration="1ep")
    return Engine(state, Logger(state), callbacks, warn_slow=False)


def batches(engine: Engine, n: int, log: Any, producer: list[int]) -> None:
    """``n`` batches, ``log(b)`` in each; notes the producer's thread."""
    producer.append(threading.get_ident())
    bus, timer = engine._bus, engine.state._timer
    for b in range(n):
        bus.publish(E.BATCH_START)
        log(b)
        time.sleep(0)  # the GIL released, as compute does
        timer.on_batch_complete(1)
        bus.publish(E.BATCH_END)


async def test_a_cheap_destinations_records_run_on_the_training_thread_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    woken = count_thread_wakes(monkeypatch)
    sink = Sink()
    engine = make_engine([sink])
    producer: list[int] = []

    marks: dict[int, int] = {}

    def log(b: int) -> None:
        if b in (200, 600):
            marks[b] = woken.count("Sink")
        engine.logger.log_metrics({"x": float(b)}, step=b)

    await engine.run_cycle(lambda: batches(engine, 640, log, producer))
    assert sink.steps == list(range(640))  # every record, once, in order
    here = sum(t == producer[0] for t in sink.threads)
    # The first burst runs on its thread (it learns the handler is cheap); the rest here.
    assert here >= 640 - 2 * 64, f"only {here} of 640 records ran on the training thread"
    # At the end fewer than a burst (64) may still wait; close hands those to its thread.
    assert all(t == producer[0] for t in sink.threads[200:640 - 64])
    assert marks[600] == marks[200], "the destination's thread was woken for records"
    stats = engine.statistics().callbacks[0]
    assert stats.inline == here


async def test_a_slow_destinations_records_never_run_on_the_training_thread() -> None:
    sink = Sink(cost=2e-3)  # 40 times inline_max: never cheap
    engine = make_engine([sink])
    producer: list[int] = []

    def log(b: int) -> None:
        engine.logger.log_metrics({"x": float(b)}, step=b)

    await engine.run_cycle(lambda: batches(engine, 200, log, producer))
    assert sink.steps == list(range(200))
    assert producer[0] not in sink.threads


class _Pending:
    """A device copy that has not finished until ``done`` is set (a CUDA event's role)."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.waited_on: list[int] = []

    def query(self) -> bool:
        return self.done.is_set()

    def synchronize(self) -> None:
        self.waited_on.append(threading.get_ident())
        assert self.done.wait(WATCHDOG)


def not_ready_loss(value: float, copy: _Pending) -> torch.Tensor:
    """A scalar tensor whose host copy was started and is not finished (as on CUDA)."""
    loss = torch.tensor(value)
    scalar = DeferredScalar(loss)
    scalar._value, scalar._event, scalar._host = None, copy, torch.tensor(value)
    setattr(loss, _HOST_COPY_ATTR, scalar)
    return loss


async def test_a_record_whose_device_copy_is_not_ready_is_left_to_the_destinations_thread(
) -> None:
    sink = Sink()
    engine = make_engine([sink])
    producer: list[int] = []
    copy = _Pending()

    def log(b: int) -> None:
        if b == 500:  # long after the destination was found cheap
            engine.logger.log_metrics({"x": not_ready_loss(1.5, copy)}, step=b)
            threading.Timer(0.05, copy.done.set).start()
        else:
            engine.logger.log_metrics({"x": float(b)}, step=b)

    await engine.run_cycle(lambda: batches(engine, 640, log, producer))
    assert sink.steps == list(range(640))  # still in order: the rest waited behind it
    assert copy.waited_on, "the record was resolved without waiting: the test did not test"
    assert producer[0] not in copy.waited_on  # D14: the training thread never waited
    assert sink.threads[500] != producer[0]


class Failing(Sink):
    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        super().log_metrics(metrics, step)
        if step == 300:
            raise RuntimeError("disk full")


async def test_a_destination_failing_on_the_training_thread_stops_the_run_with_its_error(
) -> None:
    sink = Failing()
    engine = make_engine([sink])
    producer: list[int] = []

    def log(b: int) -> None:
        engine.logger.log_metrics({"x": float(b)}, step=b)

    with pytest.raises(RuntimeError, match="disk full") as info:
        await engine.run_cycle(lambda: batches(engine, 640, log, producer))
    assert sink.threads[300] == producer[0]  # it failed there, not on its thread
    assert any("Failing" in note for note in getattr(info.value, "__notes__", []))
    assert sink.steps[-1] < 640  # the run stopped (D10)
