"""Wake-ups of the event loop: cheap ``async def`` handlers ride along with the barrier.

Waking the loop from the training thread costs thread hand-offs (SPEC section 7: "amortise:
wake a lane once per burst ... keep cheap handlers off the thread-switch path"). An
``async def`` handler that finishes without suspending, within ``inline_max``, is *cheap*:
its items of non-barrier events are queued without waking the loop, and run on the loop
when the next barrier wakes it (or within a few milliseconds, ``_inline.py``). A handler
that suspends (it does I/O) is woken for at once, every time.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import pytest
import torch

from tests.dispatch._probes import WATCHDOG
from trainbus import Callback, Engine, Event, Logger, LoggerDestination, State
from trainbus.bus import _session

pytestmark = pytest.mark.anyio

E = Event
BURSTS = (
    (E.AFTER_DATALOADER, E.BATCH_START, E.BEFORE_TRAIN_BATCH, E.BEFORE_FORWARD),
    (E.AFTER_FORWARD, E.BEFORE_LOSS),
    (E.AFTER_LOSS, E.BEFORE_BACKWARD),
    (E.AFTER_BACKWARD,),
    (E.AFTER_TRAIN_BATCH, E.BATCH_END),
    (E.BATCH_CHECKPOINT,),
)
PER_BATCH = [event for burst in BURSTS for event in burst]


def counting_class() -> type[Callback]:
    """A callback with a cheap ``async def`` handler on every per-batch event."""

    def make(event: Event) -> Any:
        async def handler(self: Any, state: Any, logger: Any) -> None:
            self.seen.append(event)

        return handler

    methods: dict[str, Any] = {event.value: make(event) for event in PER_BATCH}
    return type("CheapAsync", (Callback,), methods)


def make_engine(callbacks: list[Callback]) -> Engine:
    state = State(model=torch.nn.Linear(1, 1), max_duration="1ep")
    return Engine(state, Logger(state), callbacks, warn_slow=False)


def publish_batches(engine: Engine, batches: int, mark: int, wakes: list[int]) -> None:
    """Publish ``batches`` batches of bursts, the GIL released between bursts (as compute
    does); note the loop's wake-ups after batch ``mark`` and at the end."""
    bus = engine._bus
    timer = engine.state._timer
    for b in range(batches):
        if b == mark:
            wakes.append(engine.statistics().loop_wakeups)
        for burst in BURSTS:
            if E.BATCH_END in burst:
                timer.on_batch_complete(1)
            bus.publish(*burst)
            time.sleep(0)  # the loop thread may take the GIL here
    wakes.append(engine.statistics().loop_wakeups)


async def test_cheap_async_handlers_wake_the_loop_about_once_per_batch() -> None:
    callbacks = [counting_class()() for _ in range(10)]
    for cb in callbacks:
        cb.seen = []  # type: ignore[attr-defined]
    engine = make_engine(callbacks)
    wakes: list[int] = []
    await engine.run_cycle(lambda: publish_batches(engine, 60, 10, wakes))
    per_batch = (wakes[1] - wakes[0]) / 50
    # One wake per burst (6 per batch) before; one at BATCH_END now, plus rare timer wakes
    # on a loaded machine.
    assert per_batch <= 2.5, f"{per_batch:.2f} loop wake-ups per batch"
    for cb in callbacks:  # every handler ran, in order (D1)
        assert cb.seen == PER_BATCH * 60  # type: ignore[attr-defined]


class Uploads(Callback):
    """Suspends in ``batch_start`` (I/O); says when it has started."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.calls = 0

    async def batch_start(self, state: Any, logger: Any) -> None:
        self.calls += 1
        self.started.set()
        await anyio.sleep(0)


async def test_a_handler_that_suspends_is_woken_for_at_once_every_time() -> None:
    uploads = Uploads()
    engine = make_engine([uploads])

    def produce() -> None:
        bus = engine._bus
        timer = engine.state._timer
        for _ in range(5):
            uploads.started.clear()
            bus.publish(E.BATCH_START)
            # No barrier comes until it started: only a prompt wake-up starts it.
            assert uploads.started.wait(WATCHDOG)
            timer.on_batch_complete(1)
            bus.publish(E.BATCH_END)

    await engine.run_cycle(produce)
    slot = engine._bus.members[0].slots[E.BATCH_START]
    assert not slot.inline_ok  # never deferred: it suspends
    assert uploads.calls == 5


class Cheap(Callback):
    def __init__(self) -> None:
        self.ran = threading.Event()

    async def batch_start(self, state: Any, logger: Any) -> None:
        self.ran.set()

    async def batch_end(self, state: Any, logger: Any) -> None:
        return None


async def test_a_deferred_cheap_handler_still_runs_when_no_barrier_comes() -> None:
    cheap = Cheap()
    engine = make_engine([cheap])

    def produce() -> None:
        bus = engine._bus
        timer = engine.state._timer
        for _ in range(3):  # it proves cheap
            bus.publish(E.BATCH_START)
            timer.on_batch_complete(1)
            bus.publish(E.BATCH_END)
        assert engine._bus.members[0].slots[E.BATCH_START].inline_ok
        cheap.ran.clear()
        bus.publish(E.BATCH_START)  # deferred, and no barrier follows for a while
        assert cheap.ran.wait(WATCHDOG)  # the defer timer wakes the loop for it

    await engine.run_cycle(produce)


# -- records ---------------------------------------------------------------------------------


class Sink(LoggerDestination):
    """A plain destination (a thread lane) that notes every record it receives."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.got = threading.Event()

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        self.steps.append(step)
        self.got.set()


def count_thread_wakes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Note the lane of every wake-up of a thread lane's driver."""
    woken: list[str] = []
    original = _session._put_token

    def put_token(lane: Any) -> None:
        woken.append(lane.name)
        original(lane)

    monkeypatch.setattr(_session, "_put_token", put_token)
    return woken


async def test_records_wake_their_destination_once_per_burst_not_once_per_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    woken = count_thread_wakes(monkeypatch)
    sink = Sink()
    engine = make_engine([sink])

    def produce() -> None:
        bus, timer, logger = engine._bus, engine.state._timer, engine.logger
        for b in range(100):
            bus.publish(E.BATCH_START)
            logger.log_metrics({"x": float(b)}, step=b)
            time.sleep(0)  # the destination's thread may take the GIL here
            timer.on_batch_complete(1)
            bus.publish(E.BATCH_END)

    await engine.run_cycle(produce)
    assert sink.steps == list(range(100))  # every record, in order, by the end of the run
    # One wake-up per record before; now one per RECORD_BURST records or RECORD_DEFER_MAX.
    assert woken.count("Sink") <= 25, f"{woken.count('Sink')} wake-ups for 100 records"


async def test_a_deferred_record_is_delivered_without_anything_else_happening() -> None:
    sink = Sink()
    engine = make_engine([sink])

    def produce() -> None:
        engine.logger.log_metrics({"x": 1.0}, step=7)
        # Nothing else is published or logged: the defer timer wakes the destination.
        assert sink.got.wait(WATCHDOG)

    await engine.run_cycle(produce)
    assert sink.steps == [7]


class CheapPlain(Callback):
    """Cheap plain handlers at a non-barrier event and at the barrier."""

    def __init__(self) -> None:
        self.calls = 0

    def batch_start(self, state: Any, logger: Any) -> None:
        self.calls += 1

    def batch_end(self, state: Any, logger: Any) -> None:
        self.calls += 1


async def test_cheap_handlers_ride_along_with_a_barrier_a_few_milliseconds_away(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch of a few milliseconds (compute between the events) must not send cheap plain
    handlers to their threads: they wait for the barrier (one thread hand-off each, per batch,
    when the bound was 1 ms: a 256-512-10 MLP batch takes longer on a slow machine)."""
    woken = count_thread_wakes(monkeypatch)
    callbacks = [CheapPlain() for _ in range(10)]
    engine = make_engine(list(callbacks))

    def produce() -> None:
        bus, timer = engine._bus, engine.state._timer
        for b in range(25):
            if b == 5:
                woken.clear()  # after the handlers proved cheap
            bus.publish(E.BATCH_START)
            time.sleep(0.003)  # the batch's compute
            timer.on_batch_complete(1)
            bus.publish(E.BATCH_END)

    await engine.run_cycle(produce)
    assert all(cb.calls == 50 for cb in callbacks)
    # 10 lanes x 20 batches = 200 hand-offs with a 1 ms bound; a loaded machine may
    # stretch a batch past the bound now and then.
    assert len(woken) <= 40, f"{len(woken)} thread wake-ups in 20 batches"


# -- tasks -------------------------------------------------------------------------------


class TaskNoter(Callback):
    """Suspends in ``batch_end`` (I/O) and notes the task each call runs in."""

    def __init__(self) -> None:
        self.tasks: list[int] = []

    async def batch_end(self, state: Any, logger: Any) -> None:
        self.tasks.append(anyio.get_current_task().id)
        await anyio.sleep(0)
        assert anyio.get_current_task().id == self.tasks[-1]  # one task per call throughout


async def test_a_handler_that_suspends_every_call_costs_no_new_task_per_call() -> None:
    # Each suspension hands the dispatcher's role to another task; the task that owned the
    # lane parks as a spare and takes the role back at the next one (spawning a task costs
    # tens of microseconds in anyio). Before, every call ran in a task of its own.
    noter = TaskNoter()
    engine = make_engine([noter])

    def produce() -> None:
        bus, timer = engine._bus, engine.state._timer
        for _ in range(30):
            bus.publish(E.BATCH_START)
            timer.on_batch_complete(1)
            bus.publish(E.BATCH_END)

    await engine.run_cycle(produce)
    assert len(noter.tasks) == 30
    assert len(set(noter.tasks)) <= 3, f"{len(set(noter.tasks))} tasks for 30 calls"
