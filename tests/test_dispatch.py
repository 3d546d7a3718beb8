"""The dispatch guarantees D1-D13 of SPEC section 3, one test (or a small group) each.

Every test is built to fail if its guarantee broke: handlers meet inside each other
(concurrency without timing), wait for the training thread to publish a later event
(overlap without timing), and lockstep ``@blocking`` probes record what the training
thread sees right after a ``publish`` returns. Where time is inherent (D7's loop
lateness) the check is a ratio with a wide margin.

Async handlers here mostly suspend once with ``await anyio.sleep(0)`` before anything
that may open a cancel scope, so each test checks its own guarantee even if scope
nesting broke (``test_d13_async_handlers_may_suspend_inside_their_own_cancel_scopes``
checks that).
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest
import torch

from tests.helpers import EventLog, TinyModel, make_trainer
from trainbus import (
    Callback,
    EngineThreadError,
    Event,
    LoggerDestination,
    SlowCallbackWarning,
    Trainer,
    blocking,
)
from trainbus.loggers import InMemoryLogger

E = Event
WATCHDOG = 20.0  # seconds: a broken guarantee fails the test instead of hanging it
BATCH_EVENTS = (
    E.AFTER_DATALOADER,
    E.BATCH_START,
    E.BEFORE_TRAIN_BATCH,
    E.BEFORE_FORWARD,
    E.AFTER_FORWARD,
    E.BEFORE_LOSS,
    E.AFTER_LOSS,
    E.BEFORE_BACKWARD,
    E.AFTER_BACKWARD,
    E.AFTER_TRAIN_BATCH,
)
EVAL_BATCH_EVENTS = (
    E.EVAL_BATCH_START,
    E.EVAL_BEFORE_FORWARD,
    E.EVAL_AFTER_FORWARD,
    E.EVAL_BATCH_END,
)


def expected(
    n_batches: int, epochs: int = 1, *, eval_batches: int = 0, init: bool = True, start: int = 0
) -> list[tuple[Event, int]]:
    """Composer's event order as ``(event, int(state.timer.batch))`` (SPEC section 2)."""
    out = [(E.INIT, start)] if init else []
    b = start
    out.append((E.FIT_START, b))
    for _ in range(epochs):
        out.append((E.EPOCH_START, b))
        for _ in range(n_batches):
            out += [(e, b) for e in BATCH_EVENTS]
            b += 1
            out += [(E.BATCH_END, b), (E.BATCH_CHECKPOINT, b)]
        out.append((E.EPOCH_END, b))
        if eval_batches:
            out.append((E.EVAL_START, b))
            out += [(e, b) for e in EVAL_BATCH_EVENTS] * eval_batches
            out.append((E.EVAL_END, b))
        out.append((E.EPOCH_CHECKPOINT, b))
    out.append((E.FIT_END, b))
    return out


async def fit(trainer: Trainer, **kw: Any) -> None:
    with anyio.fail_after(WATCHDOG):
        await trainer.fit(**kw)


async def until(predicate: Callable[[], bool], what: str = "condition") -> None:
    """Poll ``predicate`` from a coroutine handler (no cancel scope: it may run late)."""
    await anyio.sleep(0)
    deadline = time.monotonic() + WATCHDOG / 2
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await anyio.sleep(0.001)


async def nap(seconds: float) -> None:
    """Sleep in a coroutine handler, suspending once first (see the module docstring)."""
    await anyio.sleep(0)
    await anyio.sleep(seconds)


def batch_of(state: Any) -> int:
    return int(state.timer.batch)


class Progress(Callback):
    """Lockstep with the training thread (``@blocking``): what it has published so far."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.started = 0  # AFTER_DATALOADER events published
        self.batches = 0  # BATCH_END events published
        self.fit_ended = False

    def _update(self, **values: Any) -> None:
        with self.cond:
            for name, value in values.items():
                setattr(self, name, value)
            self.cond.notify_all()

    @blocking
    def after_dataloader(self, state: Any, logger: Any) -> None:
        self._update(started=self.started + 1)

    @blocking
    def batch_end(self, state: Any, logger: Any) -> None:
        self._update(batches=batch_of(state))

    @blocking
    def fit_end(self, state: Any, logger: Any) -> None:
        self._update(fit_ended=True)

    def wait(self, predicate: Callable[[Progress], bool]) -> None:
        """Block a plain handler until ``predicate(self)`` holds."""
        with self.cond:
            assert self.cond.wait_for(lambda: predicate(self), WATCHDOG / 2), "producer stalled"


class Witness(Callback):
    """Records every event in lockstep with the training thread (a ``@blocking`` run_event)."""

    def __init__(self) -> None:
        self.events: list[tuple[Event, int]] = []

    @blocking
    def run_event(self, event: Event, state: Any, logger: Any) -> None:
        self.events.append((event, batch_of(state)))


class Closes(Callback):
    """Counts close/post_close; a base for callbacks of these tests."""

    def __init__(self) -> None:
        self.closed = 0
        self.post_closed = 0

    def close(self, state: Any, logger: Any) -> None:
        self.closed += 1

    def post_close(self) -> None:
        self.post_closed += 1


# --- D1 per-callback order --------------------------------------------------------------


class OrderProbe(Callback):
    """Records each call and how many of its handlers ever ran at once."""

    def __init__(self) -> None:
        self.events: list[tuple[Event, int]] = []
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def enter(self, event: Event, state: Any) -> int:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        self.events.append((event, batch_of(state)))
        return len(self.events)

    def leave(self) -> None:
        with self._lock:
            self.active -= 1


def _sync_handler(event: Event) -> Callable[..., None]:
    def handler(self: OrderProbe, state: Any, logger: Any) -> None:
        n = self.enter(event, state)
        try:
            if n % 7 == 3:  # now and then slow: runs on the lane thread, else often inline
                time.sleep(0.001)
        finally:
            self.leave()

    return handler


def _async_handler(event: Event) -> Callable[..., Any]:
    async def handler(self: OrderProbe, state: Any, logger: Any) -> None:
        n = self.enter(event, state)
        try:
            await anyio.sleep(0)  # a lane that ran two handlers at once would interleave here
            if n % 5 == 2:
                await anyio.sleep(0.001)
        finally:
            self.leave()

    return handler


def probe_class(kind: str) -> type[OrderProbe]:
    """An OrderProbe with a ``kind`` ('sync', 'async', 'mixed') method for every event."""
    ns: dict[str, Any] = {}
    for i, event in enumerate(Event):
        is_async = kind == "async" or (kind == "mixed" and i % 2 == 1)
        ns[event.value] = _async_handler(event) if is_async else _sync_handler(event)
    return type(f"{kind.title()}Probe", (OrderProbe,), ns)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "config",
    [{}, {"barriers": ()}, {"max_lag": 2}, {"barriers": (), "queue_size": 2}],
    ids=["default", "no-barriers", "max-lag-2", "queue-2"],
)
async def test_d1_each_callback_sees_every_event_once_in_order_one_at_a_time(
    config: dict[str, Any],
) -> None:
    probes = [probe_class(kind)() for kind in ("sync", "async", "mixed")]
    trainer = make_trainer(3, 2, probes, eval_batches=1, warn_slow_callbacks=False, **config)
    await fit(trainer)
    want = expected(3, 2, eval_batches=1)
    for probe in probes:
        assert probe.events == want, type(probe).__name__
        assert probe.max_active == 1, f"{type(probe).__name__} ran handlers concurrently"
        assert probe.active == 0


# --- D2 cross-callback concurrency ------------------------------------------------------


@pytest.mark.anyio
async def test_d2_async_handlers_of_eight_callbacks_are_all_inside_at_once() -> None:
    n = 8
    arrived: dict[int, int] = {}
    gates: dict[int, anyio.Event] = {}

    class Meet(Callback):
        async def batch_end(self, state: Any, logger: Any) -> None:
            b = batch_of(state)
            gate = gates.setdefault(b, anyio.Event())
            arrived[b] = arrived.get(b, 0) + 1
            if arrived[b] == n:
                gate.set()
            await gate.wait()  # returns only once all n handlers of this batch are inside

    await fit(make_trainer(2, callbacks=[Meet() for _ in range(n)]))
    assert arrived == {1: n, 2: n}


def test_d2_plain_handlers_of_eight_callbacks_are_all_inside_at_once() -> None:
    meeting = threading.Barrier(8, timeout=WATCHDOG / 2)  # BrokenBarrierError if sequential
    met: list[int] = []

    class Meet(Callback):
        def batch_end(self, state: Any, logger: Any) -> None:
            meeting.wait()
            met.append(batch_of(state))

    # One batch: a plain handler that once ran fast may later run inline (see below).
    make_trainer(1, callbacks=[Meet() for _ in range(8)]).fit_sync()
    assert met == [1] * 8


@pytest.mark.anyio
async def test_d2_plain_handler_that_was_fast_once_still_runs_concurrently() -> None:
    partners = 3
    arrived = [threading.Event() for _ in range(partners)]
    waited: list[bool] = []

    class Waits(Callback):  # fast at batch 1; at batch 2 it waits for its partner's handler
        def __init__(self, i: int) -> None:
            self.i = i

        def batch_end(self, state: Any, logger: Any) -> None:
            if batch_of(state) == 2:
                waited.append(arrived[self.i].wait(0.5))

    class Partner(Callback):
        def __init__(self, i: int) -> None:
            self.i = i

        async def batch_end(self, state: Any, logger: Any) -> None:
            if batch_of(state) == 2:
                arrived[self.i].set()

    cbs: list[Callback] = [Waits(i) for i in range(partners)]
    cbs += [Partner(i) for i in range(partners)]
    await fit(make_trainer(2, callbacks=cbs, warn_slow_callbacks=False))
    assert waited == [True] * partners


# --- D3 overlap -------------------------------------------------------------------------


class LossSignalModel(TinyModel):
    """Sets ``loss_computed`` when the training thread has computed a loss."""

    def __init__(self) -> None:
        super().__init__()
        self.loss_computed = threading.Event()

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        out = super().loss(outputs, batch)
        self.loss_computed.set()
        return out


class LossCountModel(TinyModel):
    """Counts the losses the training thread has computed."""

    def __init__(self) -> None:
        super().__init__()
        self.losses = 0

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        out = super().loss(outputs, batch)
        self.losses += 1
        return out


class FastThenWaits(Callback):
    """Cheap at batch 1 (so it may go inline); then waits a while for each batch's loss."""

    def __init__(self, model: TinyModel, losses: Callable[[], int], patience: float) -> None:
        self.model, self.losses, self.patience = model, losses, patience
        self.stalls = 0  # calls on the training thread: it could not compute meanwhile
        self.waited: list[tuple[int, bool]] = []

    def after_forward(self, state: Any, logger: Any) -> None:
        b = batch_of(state)
        if b == 0:
            return
        if threading.get_ident() in self.model.forward_threads:
            self.stalls += 1
        deadline = time.monotonic() + self.patience
        while self.losses() <= b and time.monotonic() < deadline:
            time.sleep(0.001)
        self.waited.append((b, self.losses() > b))  # the training thread computed the loss


@pytest.mark.anyio
async def test_d3_strict_with_inline_max_0_publishing_never_waits_for_a_plain_handler() -> None:
    model = LossCountModel()
    cbs = [FastThenWaits(model, lambda: model.losses, WATCHDOG / 4) for _ in range(5)]
    trainer = make_trainer(4, callbacks=cbs, model=model, inline_max=0, warn_slow_callbacks=False)
    await fit(trainer)
    for cb in cbs:
        assert cb.stalls == 0
        assert cb.waited == [(1, True), (2, True), (3, True)]


@pytest.mark.anyio
async def test_d3_cheap_plain_handlers_never_make_publishing_wait() -> None:
    # The inline fast path defers a cheap plain handler of a non-barrier event to the next
    # barrier (where the training thread waits anyway) instead of running it at publication:
    # each handler below returns only once the training thread computed the batch's loss,
    # so a publish that ran it on the spot would wait out its patience every batch.
    model = LossCountModel()
    cbs = [FastThenWaits(model, lambda: model.losses, 0.2) for _ in range(3)]
    await fit(make_trainer(5, callbacks=cbs, model=model, warn_slow_callbacks=False))
    for cb in cbs:
        assert cb.waited == [(b, True) for b in range(1, 5)]


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_d3_publishing_does_not_wait_for_the_handlers(kind: str) -> None:
    model = LossSignalModel()
    seen: list[bool] = []

    class Overlap(Callback):
        # AFTER_FORWARD's handler returns only once the training thread went on to compute
        # the loss: a publish that waited for its handlers would deadlock here.
        if kind == "sync":

            def after_forward(self, state: Any, logger: Any) -> None:
                seen.append(model.loss_computed.wait(WATCHDOG / 2))

        else:

            async def after_forward(self, state: Any, logger: Any) -> None:
                await until(model.loss_computed.is_set, "the loss")
                seen.append(True)

    await fit(make_trainer(1, callbacks=[Overlap()], model=model))
    assert seen == [True]


# --- D4 barriers ------------------------------------------------------------------------


@pytest.mark.anyio
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

    await fit(make_trainer(n, callbacks=[a, s, Check()], warn_slow_callbacks=False))
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


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_d4_no_barriers_leaves_only_close(kind: str) -> None:
    progress = Progress()

    class Behind(Callback):
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


@pytest.mark.anyio
@pytest.mark.parametrize("max_lag", [1, 2])
async def test_d4_max_lag_lets_handlers_trail_by_k_batches_and_never_more(max_lag: int) -> None:
    n = 6
    progress = Progress()

    class Lagging(Callback):
        def __init__(self) -> None:
            self.lag: dict[int, int] = {}

        async def batch_end(self, state: Any, logger: Any) -> None:
            m = batch_of(state)
            # May trail by max_lag: the producer publishes BATCH_END m + max_lag first ...
            await until(lambda: progress.batches >= min(m + max_lag, n), "the producer")
            await anyio.sleep(0.02)  # ... and gets room to run further ahead if it ignored us
            self.lag[m] = progress.batches - m

    lagging = Lagging()
    trainer = make_trainer(
        n, callbacks=[progress, lagging], max_lag=max_lag, warn_slow_callbacks=False
    )
    await fit(trainer)
    assert lagging.lag == {m: min(max_lag, n - m) for m in range(1, n + 1)}


@pytest.mark.anyio
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


@pytest.mark.anyio
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


# --- D5 snapshot fidelity ---------------------------------------------------------------


class Truth(Callback):
    """Lockstep: the live state's per-batch fields at each event."""

    def __init__(self) -> None:
        self.live: Any = None
        self.rows: list[tuple[Any, ...]] = []

    @blocking
    def run_event(self, event: Event, state: Any, logger: Any) -> None:
        live = self.live
        self.rows.append((event, live.timestamp, live.batch, live.outputs, live.loss))


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_d5_late_handlers_read_the_state_of_their_own_event(kind: str) -> None:
    n = 5
    progress, truth, memory = Progress(), Truth(), InMemoryLogger()

    class Reader(Callback):
        """Runs late: its AFTER_DATALOADER waits until the producer is a batch ahead."""

        def __init__(self) -> None:
            self.rows: list[tuple[Any, ...]] = []
            self.behind: list[int] = []

        def record(self, event: Event, state: Any, logger: Any) -> None:
            self.rows.append((event, state.timestamp, state.batch, state.outputs, state.loss))
            self.behind.append(int(truth.live.timer.batch) - batch_of(state))
            if event is E.BATCH_END:
                logger.log_metrics({"seen": batch_of(state)})  # default step: its event's

        if kind == "sync":

            def run_event(self, event: Event, state: Any, logger: Any) -> None:
                if event is E.AFTER_DATALOADER:
                    b = batch_of(state)
                    progress.wait(lambda p: p.batches >= min(b + 2, n))
                self.record(event, state, logger)

        else:

            async def run_event(self, event: Event, state: Any, logger: Any) -> None:
                if event is E.AFTER_DATALOADER:
                    b = batch_of(state)
                    await until(lambda: progress.batches >= min(b + 2, n), "the producer")
                self.record(event, state, logger)

    reader = Reader()
    trainer = make_trainer(
        n,
        callbacks=[progress, truth, reader],
        loggers=[memory],
        max_lag=2,
        warn_slow_callbacks=False,
    )
    truth.live = trainer.state
    await fit(trainer)
    assert max(reader.behind) >= 1  # it really ran while the live state had moved on
    assert len(reader.rows) == len(truth.rows) == len(expected(n))
    for got, want in zip(reader.rows, truth.rows, strict=True):
        assert got[:2] == want[:2]  # event, timestamp
        assert all(g is w for g, w in zip(got[2:], want[2:], strict=True)), got[0]
    seen = memory.get_timeseries("seen")
    assert seen["seen"] == seen["step"] == list(range(1, n + 1))


# --- D6 close ---------------------------------------------------------------------------


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
        3, callbacks=[AsyncStraggler(), SyncStraggler()], barriers=(), warn_slow_callbacks=False
    )
    await fit(trainer)
    assert sorted(finished) == ["async", "sync"]
    stats = trainer.engine.statistics()
    assert stats.queue_depth == 0
    assert [c.pending for c in stats.callbacks] == [0, 0]


# --- D7 never block the loop ------------------------------------------------------------


@pytest.mark.anyio
async def test_d7_plain_handlers_never_run_on_the_loop_which_stays_responsive() -> None:
    loop_thread = threading.get_ident()
    nap_s = 0.25
    threads: set[int] = set()
    sleeping, woke = threading.Event(), threading.Event()

    def note(self: Any, state: Any, logger: Any) -> None:
        threads.add(threading.get_ident())

    class Plain(Callback):
        def batch_end(self, state: Any, logger: Any) -> None:
            threads.add(threading.get_ident())
            sleeping.set()
            time.sleep(nap_s)
            woke.set()

        def close(self, state: Any, logger: Any) -> None:
            threads.add(threading.get_ident())

    for event in Event:  # fast plain handlers elsewhere: some run inline, none on the loop
        if event is not E.BATCH_END:
            setattr(Plain, event.value, note)

    class AsyncWithPlainClose(Callback):
        async def batch_end(self, state: Any, logger: Any) -> None:
            await anyio.sleep(0)

        def close(self, state: Any, logger: Any) -> None:
            threads.add(threading.get_ident())

    lateness: list[float] = []
    ticks_while_sleeping = 0

    async def ticker() -> None:
        nonlocal ticks_while_sleeping
        while not woke.is_set():
            t0 = time.perf_counter()
            await anyio.sleep(0.005)
            lateness.append(time.perf_counter() - t0 - 0.005)
            if sleeping.is_set() and not woke.is_set():
                ticks_while_sleeping += 1

    trainer = make_trainer(1, callbacks=[Plain(), AsyncWithPlainClose()], warn_slow_callbacks=False)
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await fit(trainer)
    assert loop_thread not in threads
    # A handler run on the loop would delay one tick by ~nap_s and allow ~1 tick in all.
    assert max(lateness) < 0.4 * nap_s
    assert ticks_while_sleeping >= 10


@pytest.mark.anyio
async def test_d7_plain_post_close_never_runs_on_the_loop() -> None:
    loop_thread = threading.get_ident()
    threads: list[int] = []

    class AsyncWithPlainPostClose(Callback):
        async def batch_end(self, state: Any, logger: Any) -> None:
            await anyio.sleep(0)

        def post_close(self) -> None:
            threads.append(threading.get_ident())

    await fit(make_trainer(1, callbacks=[AsyncWithPlainPostClose()]))
    assert threads and loop_thread not in threads


# --- D8 run_event override --------------------------------------------------------------


@pytest.mark.anyio
async def test_d8_run_event_override_gets_every_event_and_no_per_event_method() -> None:
    class Base(Closes):
        def __init__(self) -> None:
            super().__init__()
            self.events: list[tuple[Event, int]] = []
            self.direct = 0

        def batch_end(self, state: Any, logger: Any) -> None:
            self.direct += 1

        async def after_forward(self, state: Any, logger: Any) -> None:
            self.direct += 1

    class SyncOverride(Base):
        def run_event(self, event: Event, state: Any, logger: Any) -> None:
            self.events.append((event, batch_of(state)))

    class AsyncOverride(Base):
        async def run_event(self, event: Event, state: Any, logger: Any) -> None:
            await anyio.sleep(0)
            self.events.append((event, batch_of(state)))

    cbs = [SyncOverride(), AsyncOverride()]
    # warn_slow_callbacks=False: an await on every event of a toy model's sub-ms batch
    # can trip the slow-callback check; that is not what this test is about.
    await fit(make_trainer(2, 2, cbs, eval_batches=1, warn_slow_callbacks=False))
    for cb in cbs:
        assert cb.events == expected(2, 2, eval_batches=1), type(cb).__name__
        assert cb.direct == 0
        assert (cb.closed, cb.post_closed) == (1, 1)


# --- D9 blocking handlers ---------------------------------------------------------------


class FlagModel(TinyModel):
    """The training thread records ``flag`` when it computes each loss, then clears it."""

    def __init__(self) -> None:
        super().__init__()
        self.flag = False
        self.flags_seen: list[bool] = []

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        self.flags_seen.append(self.flag)
        self.flag = False
        return super().loss(outputs, batch)


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_d9_blocking_handlers_run_before_the_training_thread_continues(kind: str) -> None:
    model = FlagModel()

    def zero_grads(state: Any) -> None:
        for p in state.model.parameters():
            assert p.grad is not None
            p.grad.zero_()  # gradient surgery: the optimizer step then changes nothing

    class Lockstep(Callback):
        if kind == "sync":

            @blocking
            def after_forward(self, state: Any, logger: Any) -> None:
                time.sleep(0.005)
                model.flag = True

            @blocking
            def after_backward(self, state: Any, logger: Any) -> None:
                time.sleep(0.005)
                zero_grads(state)

        else:

            @blocking
            async def after_forward(self, state: Any, logger: Any) -> None:
                await nap(0.005)
                model.flag = True

            @blocking
            async def after_backward(self, state: Any, logger: Any) -> None:
                await nap(0.005)
                zero_grads(state)

    before = [p.detach().clone() for p in model.parameters()]
    await fit(make_trainer(3, callbacks=[Lockstep()], model=model))
    assert model.flags_seen == [True, True, True]
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))

    control = TinyModel()  # the same training without the surgery does change the weights
    await fit(make_trainer(3, model=control))
    assert not all(torch.equal(b, p) for b, p in zip(before, control.parameters(), strict=True))


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_d9_blocking_handler_runs_after_its_lanes_backlog(kind: str) -> None:
    class Backlog(Callback):
        def __init__(self) -> None:
            self.finished: list[int] = []
            self.seen: list[list[int]] = []

        async def before_backward(self, state: Any, logger: Any) -> None:
            await nap(0.01)
            self.finished.append(batch_of(state))

        if kind == "sync":

            @blocking
            def after_backward(self, state: Any, logger: Any) -> None:
                self.seen.append(list(self.finished))

        else:

            @blocking
            async def after_backward(self, state: Any, logger: Any) -> None:
                self.seen.append(list(self.finished))

    cb = Backlog()
    await fit(make_trainer(3, callbacks=[cb], warn_slow_callbacks=False))
    assert cb.seen == [[0], [0, 1], [0, 1, 2]]


@pytest.mark.anyio
async def test_d9_stop_training_takes_effect_at_the_next_batch_boundary() -> None:
    class Stopper(Callback):
        async def after_forward(self, state: Any, logger: Any) -> None:
            await anyio.sleep(0)
            if batch_of(state) == 1:
                state.stop_training()

    log = EventLog()
    trainer = make_trainer(5, callbacks=[Stopper(), log])
    await fit(trainer)
    assert int(trainer.state.timer.batch) == 2
    assert log.names[-3:] == [E.BATCH_END, E.BATCH_CHECKPOINT, E.FIT_END]
    assert log.events == [*expected(5)[: 2 + 2 * 12 + 1], (E.FIT_END, 2)]
    assert log.closed == 1


# --- D10 errors -------------------------------------------------------------------------


def _failing_class(kind: str) -> type[Closes]:
    """A callback whose AFTER_FORWARD handler raises at the second batch."""

    def check(self: Any, state: Any) -> None:
        if batch_of(state) == 1:
            self.witness_at_raise = len(self.witness.events)
            raise ValueError("boom")

    def plain(self: Any, state: Any, logger: Any) -> None:
        check(self, state)

    async def coro(self: Any, state: Any, logger: Any) -> None:
        await anyio.sleep(0)
        check(self, state)

    handler: Any = {
        "sync": plain,
        "async": coro,
        "blocking-sync": blocking(plain),
        "blocking-async": blocking(coro),
    }[kind]
    return type("Boom", (Closes,), {"after_forward": handler})


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["sync", "async", "blocking-sync", "blocking-async"])
async def test_d10_handler_error_stops_training_closes_and_is_raised_with_a_note(
    kind: str,
) -> None:
    witness, log = Witness(), EventLog()
    boom: Any = _failing_class(kind)()
    boom.witness = witness
    trainer = make_trainer(4, callbacks=[witness, boom, log])
    forwards = trainer.state.model
    with pytest.raises(ValueError, match="boom") as info:
        await fit(trainer)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "Boom.after_forward" in notes and "Event.AFTER_FORWARD" in notes
    assert (boom.closed, boom.post_closed, log.closed, log.post_closed) == (1, 1, 1, 1)
    want = expected(4)
    assert witness.events == want[: len(witness.events)]
    if kind.startswith("blocking"):  # the training thread was waiting: not one event more
        assert len(witness.events) == boom.witness_at_raise
    else:  # stopped at the latest at the BATCH_END barrier that waits for the handler
        assert len(witness.events) <= want.index((E.BATCH_END, 2)) + 1
    assert isinstance(forwards, TinyModel) and forwards.training_forwards == 2


@pytest.mark.anyio
async def test_d10_a_failed_callback_gets_no_further_handler_calls() -> None:
    class Flaky(Closes):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[tuple[Event, int]] = []

        def after_forward(self, state: Any, logger: Any) -> None:  # always on its thread
            self.calls.append((E.AFTER_FORWARD, batch_of(state)))
            if batch_of(state) == 1:
                raise ValueError("boom")
            time.sleep(0.002)  # slow once: never inline

        def before_loss(self, state: Any, logger: Any) -> None:  # cheap: may run inline
            self.calls.append((E.BEFORE_LOSS, batch_of(state)))

    flaky = [Flaky() for _ in range(3)]  # one whose before_loss runs inline shows it

    class Holds(Callback):  # offered BEFORE_LOSS first: holds that publish until they failed
        @blocking
        def before_loss(self, state: Any, logger: Any) -> None:
            if batch_of(state) == 1:
                stats = trainer.engine.statistics
                deadline = time.monotonic() + WATCHDOG / 2
                while time.monotonic() < deadline and (
                    any(c.pending for c in stats().callbacks)
                    or not any(f.calls[-1] == (E.AFTER_FORWARD, 1) for f in flaky)
                ):
                    time.sleep(0.001)

    trainer = make_trainer(3, callbacks=[Holds(), *flaky])
    with pytest.raises((ValueError, ExceptionGroup)):
        await fit(trainer)
    for cb in flaky:
        assert (E.BEFORE_LOSS, 1) not in cb.calls  # nothing after its own failure
        assert (cb.closed, cb.post_closed) == (1, 1)


@pytest.mark.anyio
async def test_d10_several_failures_raise_an_exception_group_of_the_originals() -> None:
    inside = 0
    gate: anyio.Event | None = None

    async def meet() -> None:
        nonlocal inside, gate
        gate = gate or anyio.Event()
        inside += 1
        if inside == 2:
            gate.set()
        await gate.wait()  # both handlers are running before either raises

    class FailA(Closes):
        async def batch_end(self, state: Any, logger: Any) -> None:
            await meet()
            raise ValueError("a")

    class FailB(Closes):
        async def batch_end(self, state: Any, logger: Any) -> None:
            await meet()
            raise KeyError("b")

    a, b = FailA(), FailB()
    with pytest.raises(ExceptionGroup) as info:
        await fit(make_trainer(2, callbacks=[a, b]))
    errors = {type(e): e for e in info.value.exceptions}
    assert set(errors) == {ValueError, KeyError}
    for error, name in ((errors[ValueError], "FailA"), (errors[KeyError], "FailB")):
        notes = "\n".join(getattr(error, "__notes__", []))
        assert f"{name}.batch_end" in notes and "Event.BATCH_END" in notes
    assert (a.closed, a.post_closed, b.closed, b.post_closed) == (1, 1, 1, 1)


@pytest.mark.anyio
async def test_d10_close_error_does_not_stop_other_closes_and_is_raised_after_all() -> None:
    class BadClose(Closes):
        def close(self, state: Any, logger: Any) -> None:
            super().close(state, logger)
            raise RuntimeError("close failed")

    class SlowAsyncClose(Closes):
        async def close(self, state: Any, logger: Any) -> None:
            await nap(0.02)
            self.closed += 1

        async def post_close(self) -> None:
            await anyio.sleep(0)
            self.post_closed += 1

    class SlowSyncClose(Closes):
        def close(self, state: Any, logger: Any) -> None:
            time.sleep(0.02)
            super().close(state, logger)

    cbs = [BadClose(), SlowAsyncClose(), SlowSyncClose()]
    with pytest.raises(RuntimeError, match="close failed") as info:
        await fit(make_trainer(1, callbacks=cbs))
    assert [(cb.closed, cb.post_closed) for cb in cbs] == [(1, 1)] * 3
    assert "BadClose.close" in "\n".join(getattr(info.value, "__notes__", []))


# --- D11 cancellation -------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["cancel-scope", "task-group", "fail-after", "move-on-after"])
async def test_d11_cancelling_fit_stops_training_closes_and_propagates(
    how: str, no_leaked_threads: None
) -> None:
    witness, log = Witness(), EventLog()  # log: a plain callback, on a thread lane
    parked = anyio.Event()

    class Hang(Callback):  # all async: a loop lane (plain close: see the test below)
        def __init__(self) -> None:
            self.closed = self.post_closed = 0

        async def batch_end(self, state: Any, logger: Any) -> None:
            await anyio.sleep(0)
            if batch_of(state) == 2:  # the producer waits at this barrier until cancelled
                parked.set()
                await anyio.sleep_forever()

        async def close(self, state: Any, logger: Any) -> None:
            self.closed += 1

        async def post_close(self) -> None:
            self.post_closed += 1

    hang = Hang()
    trainer = make_trainer(5, callbacks=[witness, hang, log])
    returned = False

    async def run_fit() -> None:
        nonlocal returned
        await trainer.fit()
        returned = True

    if how == "task-group":
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_fit)
            await parked.wait()
            tg.cancel_scope.cancel()
    else:
        scopes: list[anyio.CancelScope] = []

        async def expire() -> None:
            await parked.wait()
            if how == "cancel-scope":
                scopes[0].cancel()
            else:
                scopes[0].deadline = anyio.current_time()

        with anyio.fail_after(WATCHDOG):
            async with anyio.create_task_group() as tg:
                tg.start_soon(expire)
                if how == "fail-after":
                    with pytest.raises(TimeoutError):
                        with anyio.fail_after(math.inf) as scope:
                            scopes.append(scope)
                            await run_fit()
                else:
                    with (
                        anyio.CancelScope()
                        if how == "cancel-scope"
                        else anyio.move_on_after(math.inf) as scope
                    ):
                        scopes.append(scope)
                        await run_fit()
                    assert scope.cancelled_caught
    assert not returned  # the cancellation propagated out of fit()
    assert witness.events == expected(5)[: expected(5).index((E.BATCH_END, 2)) + 1]
    assert (hang.closed, hang.post_closed, log.closed, log.post_closed) == (1, 1, 1, 1)


@pytest.mark.anyio
async def test_d11_cancel_while_training_runs_stops_the_training_thread(
    no_leaked_threads: None,
) -> None:
    n = 500
    started = threading.Event()

    class Signal(Closes):
        @blocking
        def after_forward(self, state: Any, logger: Any) -> None:
            if batch_of(state) == 3:
                started.set()

    signal, log = Signal(), EventLog()
    trainer = make_trainer(
        n,
        callbacks=[signal, log],
        model=TinyModel(delay=0.002),
        barriers=(),
        warn_slow_callbacks=False,  # a plain handler's time includes GIL waits
    )
    with anyio.move_on_after(WATCHDOG) as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(trainer.fit)
            await until(started.is_set, "batch 3")
            tg.cancel_scope.cancel()
    assert not scope.cancelled_caught
    assert int(trainer.state.timer.batch) < n
    assert E.FIT_END not in log.names
    assert (signal.closed, signal.post_closed, log.closed) == (1, 1, 1)


@pytest.mark.anyio
async def test_d11_cancel_reaches_async_handlers_of_callbacks_with_plain_ones_too() -> None:
    started = anyio.Event()
    completed: list[bool] = []

    class Mixed(Callback):
        def batch_start(self, state: Any, logger: Any) -> None:
            pass

        async def batch_end(self, state: Any, logger: Any) -> None:
            started.set()
            await anyio.sleep(0)
            await anyio.sleep(1.0)  # the cancellation should end this at once
            completed.append(True)

    trainer = make_trainer(3, callbacks=[Mixed()], warn_slow_callbacks=False)
    with anyio.fail_after(WATCHDOG):
        async with anyio.create_task_group() as tg:
            tg.start_soon(trainer.fit)
            await started.wait()
            tg.cancel_scope.cancel()
    assert completed == []


@pytest.mark.anyio
async def test_d11_cancellation_does_not_drop_records_already_logged() -> None:
    class SlowSink(LoggerDestination):
        def __init__(self) -> None:
            self.got: list[int] = []
            self.receiving = threading.Event()

        async def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
            self.receiving.set()
            await nap(0.05)
            self.got.append(step)

    class Logs(Callback):
        def __init__(self) -> None:
            self.logged: list[int] = []

        @blocking
        def batch_end(self, state: Any, logger: Any) -> None:
            logger.log_metrics({"x": batch_of(state)})
            self.logged.append(batch_of(state))

    sink, logs = SlowSink(), Logs()
    trainer = make_trainer(
        20, callbacks=[logs], loggers=[sink], log_train_loss=False, warn_slow_callbacks=False
    )
    with anyio.fail_after(WATCHDOG):
        async with anyio.create_task_group() as tg:
            tg.start_soon(trainer.fit)
            await until(sink.receiving.is_set, "a delivery")
            tg.cancel_scope.cancel()
    assert logs.logged and sink.got == logs.logged


# --- D12 backpressure -------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("queue_size", [1, 4, None], ids=["q1", "q4", "default"])
async def test_d12_producer_waits_once_a_callback_has_queue_size_pending(
    kind: str, queue_size: int | None
) -> None:
    bound = 128 if queue_size is None else queue_size
    n = bound // 12 + 2  # enough batches to fill the queue
    release = threading.Event()
    published = 0
    pending_seen: list[int] = []

    class Ahead(Callback):  # lockstep, offered each event first: what was published
        @blocking
        def run_event(self, event: Event, state: Any, logger: Any) -> None:
            nonlocal published
            published += 1

    class Stuck(Callback):  # its first handler blocks until the test releases it
        def __init__(self) -> None:
            self.events: list[tuple[Event, int]] = []

        if kind == "sync":

            def run_event(self, event: Event, state: Any, logger: Any) -> None:
                if not self.events:
                    assert release.wait(WATCHDOG / 2)
                self.events.append((event, batch_of(state)))

        else:

            async def run_event(self, event: Event, state: Any, logger: Any) -> None:
                if not self.events:
                    await until(release.is_set, "the release")
                self.events.append((event, batch_of(state)))

    stuck = Stuck()

    class Behind(Callback):  # lockstep, offered each event after Stuck: its pending calls
        @blocking
        def run_event(self, event: Event, state: Any, logger: Any) -> None:
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
    assert stuck.events == expected(n)  # nothing dropped
    stats = trainer.engine.statistics()
    assert stats.callbacks[1].peak_pending == bound
    assert stats.backpressure_wait_time > 0


# --- D13 backends and entry points ------------------------------------------------------


class AsyncLog(Callback):
    def __init__(self) -> None:
        self.events: list[tuple[Event, int]] = []

    async def run_event(self, event: Event, state: Any, logger: Any) -> None:
        await anyio.sleep(0)
        self.events.append((event, batch_of(state)))


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("entry", ["fit_sync", "anyio.run"])
def test_d13_fit_from_a_plain_script(backend: str, entry: str) -> None:
    plain, coro = EventLog(), AsyncLog()
    trainer = make_trainer(2, callbacks=[plain, coro])
    if entry == "fit_sync":
        trainer.fit_sync(backend=backend)  # type: ignore[arg-type]
    else:
        anyio.run(trainer.fit, backend=backend)
    assert plain.events == coro.events == expected(2)
    assert (plain.closed, plain.post_closed) == (1, 1)


def test_d13_engine_run_event_and_close_from_plain_code() -> None:
    class Both(Closes):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[str] = []

        def epoch_start(self, state: Any, logger: Any) -> None:
            self.calls.append("plain")

    class AsyncBoth(Closes):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[str] = []

        async def epoch_start(self, state: Any, logger: Any) -> None:
            await nap(0.01)
            self.calls.append("async")

    plain, coro = Both(), AsyncBoth()
    trainer = make_trainer(1, callbacks=[plain, coro])
    trainer.engine.run_event(Event.EPOCH_START)  # returns once the handlers have run
    assert (plain.calls, coro.calls) == (["plain"], ["async"])
    trainer.engine.run_event("epoch_start")
    assert (plain.calls, coro.calls) == (["plain"] * 2, ["async"] * 2)
    trainer.engine.close()
    trainer.engine.close()  # a no-op
    assert [(cb.closed, cb.post_closed) for cb in (plain, coro)] == [(1, 1), (1, 1)]


@pytest.mark.anyio
async def test_d13_blocking_engine_calls_on_the_loop_thread_refuse_naming_the_fix() -> None:
    log = AsyncLog()
    trainer = make_trainer(1, callbacks=[log])
    with pytest.raises(EngineThreadError, match="arun_event"):
        trainer.engine.run_event(Event.EPOCH_START)
    with pytest.raises(EngineThreadError, match=r"await trainer\.fit\(\)"):
        trainer.fit_sync()
    await trainer.engine.arun_event(Event.EPOCH_START)
    assert log.events == [(E.EPOCH_START, 0)]


@pytest.mark.anyio
async def test_d13_async_handlers_may_suspend_inside_their_own_cancel_scopes() -> None:
    class Scoped(Callback):
        def __init__(self) -> None:
            self.done: list[Event] = []

        async def after_forward(self, state: Any, logger: Any) -> None:
            with anyio.fail_after(WATCHDOG):
                await anyio.sleep(0.001)
            self.done.append(E.AFTER_FORWARD)

        async def after_backward(self, state: Any, logger: Any) -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(anyio.sleep, 0.001)
            self.done.append(E.AFTER_BACKWARD)

        async def batch_end(self, state: Any, logger: Any) -> None:
            await anyio.sleep(0.001)
            self.done.append(E.BATCH_END)

    cb = Scoped()
    await fit(make_trainer(2, callbacks=[cb], warn_slow_callbacks=False))
    assert cb.done == [E.AFTER_FORWARD, E.AFTER_BACKWARD, E.BATCH_END] * 2


# --- statistics, slow-callback warning, logging order -----------------------------------


@pytest.mark.anyio
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


class Sluggish(Callback):
    def batch_end(self, state: Any, logger: Any) -> None:
        time.sleep(0.1)  # far longer than a batch of TinyModel, even on a loaded machine


def test_slow_callback_warning_names_the_callback_and_event_once() -> None:
    trainer = make_trainer(5, callbacks=[Sluggish()])  # checked at batches 2-4
    with pytest.warns(SlowCallbackWarning) as record:
        trainer.fit_sync()
    slow = [w for w in record if issubclass(w.category, SlowCallbackWarning)]
    assert len(slow) == 1
    assert "Sluggish" in str(slow[0].message) and "Event.BATCH_END" in str(slow[0].message)


def test_no_slow_callback_warning_when_disabled() -> None:
    make_trainer(5, callbacks=[Sluggish()], warn_slow_callbacks=False).fit_sync()


@pytest.mark.anyio
async def test_log_records_reach_destinations_in_order_also_from_close() -> None:
    n = 4

    class Logs(Callback):
        def __init__(self) -> None:
            self.k = 0

        def after_forward(self, state: Any, logger: Any) -> None:  # plain: inline or thread
            logger.log_metrics({"fwd": self.k})
            self.k += 1

        async def batch_end(self, state: Any, logger: Any) -> None:
            await anyio.sleep(0)
            logger.log_metrics({"end": batch_of(state)})

        def close(self, state: Any, logger: Any) -> None:
            logger.log_metrics({"closed": 1})

    class AsyncDest(LoggerDestination):
        def __init__(self) -> None:
            self.got: list[tuple[str, Any, int]] = []
            self.at_close: list[str] = []

        async def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
            await anyio.sleep(0)
            self.got += [(name, value, step) for name, value in metrics.items()]

        async def close(self, state: Any, logger: Any) -> None:
            self.at_close = [name for name, _, _ in self.got]

    adest, memory = AsyncDest(), InMemoryLogger()
    trainer = make_trainer(
        n, callbacks=[Logs()], loggers=[adest, memory], warn_slow_callbacks=False
    )
    await fit(trainer)

    def series(name: str) -> tuple[list[Any], list[int]]:
        rows = [(v, s) for m, v, s in adest.got if m == name]
        return [v for v, _ in rows], [s for _, s in rows]

    assert series("fwd") == (list(range(n)), list(range(n)))
    assert series("end") == (list(range(1, n + 1)), list(range(1, n + 1)))
    assert series("loss/train")[1] == list(range(1, n + 1))
    assert "closed" in adest.at_close  # logged in a callback's close, before loggers close
    for name in ("fwd", "end", "closed"):
        ts = memory.get_timeseries(name)
        assert (ts[name], ts["step"]) == series(name)


@pytest.mark.anyio
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
