"""``@trailing(k)`` and ``Callback.trailing = k``: a handler that may trail training by k batches.

Each test holds the trailing handler back as far as the bound allows, with events, not
sleeps: the handler of batch *n* waits until the training thread has published
``BATCH_END`` of batch *n + k* (a ``@blocking`` probe there, which runs before that
event's barrier, says so). The barrier of batch *n + k* must then wait for it: a
``@blocking`` probe at ``BATCH_CHECKPOINT``, right after the barrier, finds it done and
the next one not (exactly *k* behind). Were the bound broken, the probe would run while
the released handler is still being scheduled on the loop; were the handler held in
lockstep, the run would deadlock and the watchdog fails the test.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

import anyio
import pytest
import torch

from tests.helpers import make_trainer
from trainbus import Callback, Event, Trainer, blocking, trailing

pytestmark = pytest.mark.anyio

WATCHDOG = 20.0  # seconds: a broken bound fails the test instead of hanging it
N = 8  # batches per run


def batch_of(state: Any) -> int:
    return int(state.timer.batch)


class Clock(Callback):
    """``@blocking`` at ``BATCH_END``: says how far the training thread got.

    ``reached(b)`` returns once ``BATCH_END`` of batch ``b`` was published (before its
    barrier waits), so a handler waiting for it is released only when training has gone
    that far ahead. ``FIT_END`` releases everything (``reached(N + 1)`` only then). List
    it before the callbacks it releases: it runs first at ``BATCH_END``.
    """

    def __init__(self) -> None:
        self.async_events: dict[int, anyio.Event] = {}
        self.thread_events: defaultdict[int, threading.Event] = defaultdict(threading.Event)
        self.lock = threading.Lock()

    def _async(self, b: int) -> anyio.Event:
        if b not in self.async_events:
            self.async_events[b] = anyio.Event()
        return self.async_events[b]

    def _thread(self, b: int) -> threading.Event:
        with self.lock:
            return self.thread_events[b]

    async def reached(self, b: int) -> None:
        await self._async(b).wait()

    def reached_sync(self, b: int) -> None:
        assert self._thread(b).wait(WATCHDOG), f"training never reached batch {b}"

    @blocking
    async def batch_end(self, state: Any, logger: Any) -> None:
        self._async(batch_of(state)).set()
        self._thread(batch_of(state)).set()

    @blocking
    async def fit_end(self, state: Any, logger: Any) -> None:
        for b in range(N + 2):
            self._async(b).set()
            self._thread(b).set()


class Behind(Callback):
    """At ``BATCH_CHECKPOINT`` (after the ``BATCH_END`` barrier), on the training thread,
    records ``(batch, last batch the watched handler finished)``."""

    def __init__(self, watched: list[int]) -> None:
        self.watched = watched
        self.seen: list[tuple[int, int]] = []

    @blocking
    def batch_checkpoint(self, state: Any, logger: Any) -> None:
        self.seen.append((batch_of(state), self.watched[-1] if self.watched else 0))


def make_upload(kind: str, form: str, k: int, clock: Clock, hold: int | None = None) -> Any:
    """A callback whose ``batch_end`` trails by ``k``; batch *n* is held until training
    publishes ``BATCH_END`` of batch ``n + hold`` (``hold`` defaults to ``k``: the
    furthest the bound allows)."""
    hold = k if hold is None else hold

    def release_at(n: int) -> int:
        return release(n, hold)

    if kind == "async":

        class AsyncUpload(Callback):
            def __init__(self) -> None:
                self.finished: list[int] = []

            async def batch_end(self, state: Any, logger: Any) -> None:
                n = batch_of(state)
                await clock.reached(release_at(n))
                self.finished.append(n)

        cls: type[Any] = AsyncUpload
    else:

        class SyncUpload(Callback):
            def __init__(self) -> None:
                self.finished: list[int] = []

            def batch_end(self, state: Any, logger: Any) -> None:
                n = batch_of(state)
                clock.reached_sync(release_at(n))
                self.finished.append(n)

        cls = SyncUpload
    if form == "decorator":
        cls.batch_end = trailing(k)(cls.batch_end)
    else:
        cls.trailing = k
    return cls()


def release(n: int, hold: int) -> int:
    """The batch whose ``BATCH_END`` releases the handler of batch ``n``; past the last
    batch, ``N + 1``: released at ``FIT_END``."""
    return min(n + hold, N + 1)


async def fit(trainer: Trainer) -> None:
    with anyio.fail_after(WATCHDOG):
        await trainer.fit()


@pytest.mark.parametrize("kind", ["async", "sync"])
@pytest.mark.parametrize("form", ["decorator", "attribute"])
@pytest.mark.parametrize(("k", "max_lag"), [(1, 0), (2, 0), (2, 4)])
async def test_a_trailing_handler_is_never_more_than_k_batches_behind(
    kind: str, form: str, k: int, max_lag: int
) -> None:
    clock = Clock()
    upload = make_upload(kind, form, k, clock)
    probe = Behind(upload.finished)
    trainer = make_trainer(
        N, callbacks=[clock, upload, probe], max_lag=max_lag
    )
    await fit(trainer)
    # Held as far as allowed, it is exactly k behind (never more: the bound; and this far
    # at all only because it trails: in lockstep the run would deadlock).
    assert probe.seen == [(m, max(m - k, 0)) for m in range(1, N + 1)]
    assert upload.finished == list(range(1, N + 1))


async def test_other_callbacks_stay_lockstep_and_see_the_weights_of_their_batch() -> None:
    k = 2
    clock = Clock()
    upload = make_upload("async", "decorator", k, clock)
    truth: list[torch.Tensor] = []

    class Truth(Callback):
        @blocking  # on the training thread: the weights right after this batch's step
        def batch_end(self, state: Any, logger: Any) -> None:
            truth.append(state.model.lin.weight.detach().clone())

    class WeightReader(Callback):  # not @blocking: on its own thread, held by the barrier
        def __init__(self) -> None:
            self.weights: list[torch.Tensor] = []
            self.batches: list[int] = []

        def batch_end(self, state: Any, logger: Any) -> None:
            self.weights.append(state.model.lin.weight.detach().clone())
            self.batches.append(batch_of(state))

    class AsyncReader(Callback):  # on the loop, held by the barrier
        def __init__(self) -> None:
            self.weights: list[torch.Tensor] = []
            self.batches: list[int] = []

        async def batch_end(self, state: Any, logger: Any) -> None:
            await anyio.sleep(0)
            self.weights.append(state.model.lin.weight.detach().clone())
            self.batches.append(batch_of(state))

    reader, areader = WeightReader(), AsyncReader()
    lockstep = Behind(reader.batches)
    alockstep = Behind(areader.batches)
    behind = Behind(upload.finished)
    trainer = make_trainer(
        N,
        callbacks=[clock, upload, Truth(), reader, areader, lockstep, alockstep, behind],
    )
    await fit(trainer)
    assert behind.seen == [(m, max(m - k, 0)) for m in range(1, N + 1)]
    for probe, r in ((lockstep, reader), (alockstep, areader)):
        assert probe.seen == [(m, m) for m in range(1, N + 1)]  # lag 0
        assert len(r.weights) == len(truth) == N
        for got, want in zip(r.weights, truth, strict=True):
            assert torch.equal(got, want)


@pytest.mark.parametrize("form", ["decorator", "attribute"])
async def test_close_waits_for_a_trailing_handler(form: str) -> None:
    k = 3
    clock = Clock()
    upload = make_upload("async", form, k, clock)
    at_fit_end: list[int] = []
    at_close: list[list[int]] = []

    class FitEnd(Callback):
        @blocking
        def fit_end(self, state: Any, logger: Any) -> None:
            at_fit_end.extend(upload.finished)

    class Closer(type(upload)):  # type: ignore[misc]
        async def close(self, state: Any, logger: Any) -> None:
            at_close.append(list(self.finished))

    upload.__class__ = Closer
    trainer = make_trainer(N, callbacks=[FitEnd(), clock, upload])
    await fit(trainer)
    # At FIT_END the last k batch_end handlers were still held (the clock releases them
    # after that probe); fit() returned only after they ran, and close ran after them (D1).
    assert at_fit_end == list(range(1, N - k + 1))
    assert at_close == [list(range(1, N + 1))]
    assert upload.finished == list(range(1, N + 1))


async def test_d1_and_d5_hold_under_lag() -> None:
    """Every handler of a trailing callback runs one at a time, in publication order, and
    reads its own event's snapshot (batch, loss) though training is ahead."""
    k = 2
    clock = Clock()
    published: list[tuple[Event, int]] = []
    losses: dict[int, float] = {}

    class Publish(Callback):
        @blocking
        def run_event(self, event: Event, state: Any, logger: Any) -> None:
            if event in (Event.BATCH_START, Event.BEFORE_FORWARD, Event.BATCH_END):
                published.append((event, batch_of(state)))
            if event is Event.BATCH_END:
                losses[batch_of(state)] = float(state.loss)

    class Trail(Callback):
        trailing = k

        def __init__(self) -> None:
            self.running = 0
            self.seen: list[tuple[Event, int]] = []
            self.losses: dict[int, float] = {}
            self.finished: list[int] = []

        async def _enter(self, event: Event, state: Any) -> None:
            assert self.running == 0, "two handlers of one callback ran at once"
            self.running += 1
            await anyio.sleep(0)  # let anything that could overlap it run

        def _leave(self, event: Event, state: Any) -> None:
            self.seen.append((event, batch_of(state)))
            self.running -= 1

        async def batch_start(self, state: Any, logger: Any) -> None:
            await self._enter(Event.BATCH_START, state)
            self._leave(Event.BATCH_START, state)

        # BEFORE_FORWARD, not AFTER_FORWARD: a trailing handler of an event whose point is
        # live tensors is refused (issue 54, test_live_fence.py).
        async def before_forward(self, state: Any, logger: Any) -> None:
            await self._enter(Event.BEFORE_FORWARD, state)
            self._leave(Event.BEFORE_FORWARD, state)

        async def batch_end(self, state: Any, logger: Any) -> None:
            await self._enter(Event.BATCH_END, state)
            n = batch_of(state)
            await clock.reached(release(n, k))  # training is up to k batches on
            assert batch_of(state) == n  # its own snapshot, though the timer moved on
            self.losses[n] = float(state.loss)
            self.finished.append(n)
            self._leave(Event.BATCH_END, state)

    trail = Trail()
    probe = Behind(trail.finished)
    trainer = make_trainer(N, callbacks=[Publish(), clock, trail, probe])
    await fit(trainer)
    assert probe.seen == [(m, max(m - k, 0)) for m in range(1, N + 1)]  # it did trail
    assert trail.seen == published
    assert trail.losses == losses


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_backpressure_still_bounds_a_trailing_handler(kind: str) -> None:
    """``trailing(10)`` with ``queue_size=2``: the queue bounds it at 2 batches."""
    k, q = 10, 2
    clock = Clock()
    upload = make_upload(kind, "decorator", k, clock, hold=q)
    probe = Behind(upload.finished)
    trainer = make_trainer(
        N, callbacks=[clock, upload, probe], queue_size=q
    )
    await fit(trainer)
    assert probe.seen == [(m, max(m - q, 0)) for m in range(1, N + 1)]


@pytest.mark.parametrize("bad", [-1, True, 1.5, "2"])
def test_trailing_refuses_a_bad_count(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"trailing\(batches\)=.* must be an int >= 0.*e\.g\. 2"):
        trailing(bad)


@pytest.mark.parametrize("bad", [-1, "x", 2.0])
def test_the_class_attribute_refuses_a_bad_value_when_the_trainer_is_built(bad: Any) -> None:
    class Upload(Callback):
        trailing = bad

        async def batch_end(self, state: Any, logger: Any) -> None:
            pass

    with pytest.raises(ValueError, match=r"Upload\.trailing=.* must be an int >= 0.*e\.g\. 2"):
        make_trainer(2, callbacks=[Upload()])


# -- built-ins ------------------------------------------------------------------------------

RECORD_CONSUMERS = (
    "ConsoleLogger",
    "JSONLinesLogger",
    "TensorBoardLogger",
    "HTTPMetricsUploader",
    "MLflowLogger",
    "EventStream",
)
LOCKSTEP = (
    "SpeedMonitor",
    "LRMonitor",
    "GradMonitor",
    "MemoryMonitor",
    "EarlyStopper",
    "ThresholdStopper",
    "ProgressBar",
    "CheckpointSaver",
    "InMemoryLogger",
)


@pytest.mark.parametrize("name", RECORD_CONSUMERS)
def test_destinations_that_only_consume_records_trail_by_two(name: str) -> None:
    import trainbus.callbacks
    import trainbus.loggers

    cls = getattr(trainbus.loggers, name, None) or getattr(trainbus.callbacks, name)
    assert cls.trailing == 2


@pytest.mark.parametrize("name", LOCKSTEP)
def test_monitors_stoppers_and_the_bar_stay_lockstep(name: str) -> None:
    import trainbus.callbacks
    import trainbus.loggers

    cls = getattr(trainbus.loggers, name, None) or getattr(trainbus.callbacks, name)
    assert cls.trailing is None


async def test_a_console_logger_on_a_slow_stream_trails_training() -> None:
    """Its line for batch *n* (printed at ``BATCH_CHECKPOINT`` *n*, which the bus counts
    with batch *n + 1*) may still be pending at the barrier of batch *n + 2*: held until
    ``BATCH_END`` of batch *n + 3*, the run neither deadlocks nor lets it fall further."""
    import re

    from trainbus.loggers import ConsoleLogger

    clock = Clock()
    printed: list[int] = []

    class SlowStream:
        def write(self, text: str) -> int:
            found = re.search(r"batch (\d+)\]", text)
            if found:
                n = int(found.group(1))
                clock.reached_sync(release(n, 3))
                printed.append(n)
            return len(text)

        def flush(self) -> None:
            pass

    probe = Behind(printed)
    console = ConsoleLogger("1ba", stream=SlowStream())  # type: ignore[arg-type]
    trainer = make_trainer(
        N, callbacks=[clock, probe], loggers=[console]
    )
    await fit(trainer)
    assert probe.seen == [(m, max(m - 3, 0)) for m in range(1, N + 1)]
    assert printed == list(range(1, N + 1))


async def test_an_error_in_a_trailing_handler_stops_training_and_fit_raises_it() -> None:
    ran: list[int] = []

    class Boom(Callback):
        @trailing(2)
        async def batch_end(self, state: Any, logger: Any) -> None:
            if batch_of(state) == 3:
                raise ValueError("boom")

    class Count(Callback):
        @blocking
        def batch_start(self, state: Any, logger: Any) -> None:
            ran.append(batch_of(state))

    trainer = make_trainer(50, callbacks=[Boom(), Count()])
    with pytest.raises(ValueError, match="boom"):
        await fit(trainer)
    assert len(ran) <= 3 + 2 + 1  # at the latest, the barrier 2 batches on stops it
