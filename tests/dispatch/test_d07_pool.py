"""D7 with the pool: plain callbacks share a bounded set of lane threads, each pinned.

A plain callback runs every plain handler on one lane thread for the whole run (one of
``Trainer(lane_threads=...)``, default 8, in list order round the pool; or its own with
``own_thread = True``). The thread count of a fit does not grow with the callbacks; the
callbacks of one thread run in list order; barriers and each callback's order hold as
with a thread per callback; an event a thread's callbacks do not handle puts nothing
there; a thread the operating system refuses is a clear error, not a hang.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.dispatch._probes import WATCHDOG, batch_of
from tests.helpers import make_trainer
from trainbus import Callback, CallbackTimeoutWarning, Event, blocking
from trainbus.bus import DEFAULT_LANE_THREADS

ROOT = Path(__file__).resolve().parents[2]
BATCHES = 3
EVENTS = (
    Event.FIT_START, Event.BATCH_START, Event.AFTER_FORWARD, Event.AFTER_BACKWARD,
    Event.BATCH_END, Event.BATCH_CHECKPOINT, Event.EPOCH_END, Event.FIT_END,
)
#: Threads a fit may run beside its lane threads: the training thread, the standing
#: loop's or anyio's worker threads (a loop lane's plain close), a margin.
CONSTANT = 4


class Recorder(Callback):
    """A plain handler on each of EVENTS: notes the thread and the order it saw."""

    def __init__(self, i: int) -> None:
        self.i = i
        self.threads: set[int] = set()
        self.seen: list[tuple[Event, int]] = []
        self.active_at_close = 0

    def note(self, event: Event, state: Any) -> None:
        self.threads.add(threading.get_ident())
        self.seen.append((event, batch_of(state)))

    def close(self, state: Any, logger: Any) -> None:
        self.threads.add(threading.get_ident())
        self.active_at_close = threading.active_count()  # every close's deadline is armed


for _event in EVENTS:
    setattr(Recorder, _event.value,
            lambda self, state, logger, _e=_event: self.note(_e, state))


class Lockstep(Callback):
    """On the training thread: the thread count, and how many batch_end handlers have
    run when each batch starts (the previous batch's barrier must have waited for all)."""

    def __init__(self, recorders: list[Recorder]) -> None:
        self.recorders = recorders
        self.active: list[int] = []
        self.finished_at_start: list[tuple[int, int]] = []

    @blocking
    def batch_start(self, state: Any, logger: Any) -> None:
        self.active.append(threading.active_count())
        done = sum(
            1 for r in self.recorders for e, _ in r.seen if e is Event.BATCH_END
        )
        self.finished_at_start.append((batch_of(state), done))

    @blocking
    def batch_end(self, state: Any, logger: Any) -> None:
        self.active.append(threading.active_count())


def expected_order() -> list[tuple[Event, int]]:
    order = [(Event.FIT_START, 0)]
    for b in range(BATCHES):
        order += [(Event.BATCH_START, b), (Event.AFTER_FORWARD, b), (Event.AFTER_BACKWARD, b),
                  (Event.BATCH_END, b + 1), (Event.BATCH_CHECKPOINT, b + 1)]
    return [*order, (Event.EPOCH_END, BATCHES), (Event.FIT_END, BATCHES)]


@pytest.mark.parametrize("n", [100, pytest.param(1000, marks=pytest.mark.slow)])
def test_a_thousand_plain_callbacks_each_keep_one_thread_and_the_count_stays_bounded(
    n: int,
) -> None:
    recorders = [Recorder(i) for i in range(n)]
    lockstep = Lockstep(recorders)
    before = threading.active_count()
    trainer = make_trainer(BATCHES, callbacks=[*recorders, lockstep])
    trainer.fit_sync()

    for r in recorders:
        assert len(r.threads) == 1, (r.i, r.threads)  # every event and close, one thread
        assert r.seen == expected_order(), r.i  # D1: each event once, in order
    threads = {next(iter(r.threads)) for r in recorders}
    assert len(threads) == DEFAULT_LANE_THREADS
    bound = before + DEFAULT_LANE_THREADS + CONSTANT
    assert max(lockstep.active) <= bound, (lockstep.active, bound)
    at_close = max(r.active_at_close for r in recorders)  # one watch thread for every close
    assert at_close <= bound, (at_close, bound)
    # Pinned in list order round the pool: callback k shares the thread of callback k + 8.
    for k in range(DEFAULT_LANE_THREADS, n):
        assert recorders[k].threads == recorders[k - DEFAULT_LANE_THREADS].threads
    # D4: batch b starts only after every batch_end of the batches before it ran.
    assert lockstep.finished_at_start == [(b, n * b) for b in range(BATCHES)]
    assert threading.active_count() <= before  # nothing of the fit outlives it


def test_the_pool_size_is_the_trainers_and_callbacks_of_one_thread_run_in_list_order() -> None:
    order: list[tuple[Event, int]] = []  # appended on the one lane thread only

    class Ordered(Callback):
        def __init__(self, i: int) -> None:
            self.i = i
            self.threads: set[int] = set()

        def after_forward(self, state: Any, logger: Any) -> None:
            self.threads.add(threading.get_ident())
            order.append((Event.AFTER_FORWARD, self.i))

        def batch_end(self, state: Any, logger: Any) -> None:
            self.threads.add(threading.get_ident())
            order.append((Event.BATCH_END, self.i))

    callbacks = [Ordered(i) for i in range(5)]
    make_trainer(2, callbacks=callbacks, lane_threads=1).fit_sync()
    assert len(set().union(*(c.threads for c in callbacks))) == 1
    per_batch = [(Event.AFTER_FORWARD, i) for i in range(5)]
    per_batch += [(Event.BATCH_END, i) for i in range(5)]
    assert order == per_batch * 2


class Waiter(Callback):
    """Blocks in batch_end until its partner's batch_end ran: with the partner on the
    same thread and queued after it, that would never happen."""

    own_thread = True
    patience = WATCHDOG / 4  # a safety bound: the partner sets it at once

    def __init__(self, go: threading.Event) -> None:
        self.go = go
        self.waited: list[bool] = []
        self.threads: set[int] = set()

    def fit_start(self, state: Any, logger: Any) -> None:
        self.threads.add(threading.get_ident())

    def batch_end(self, state: Any, logger: Any) -> None:
        self.threads.add(threading.get_ident())
        self.waited.append(self.go.wait(self.patience))
        self.go.clear()


class Setter(Callback):
    def __init__(self, go: threading.Event) -> None:
        self.go = go
        self.threads: set[int] = set()

    def batch_end(self, state: Any, logger: Any) -> None:
        self.threads.add(threading.get_ident())
        self.go.set()


def test_a_callback_that_asks_for_its_own_thread_does_not_hold_up_the_pool() -> None:
    go = threading.Event()
    waiter, setter = Waiter(go), Setter(go)
    make_trainer(3, callbacks=[waiter, setter], lane_threads=1).fit_sync()
    assert waiter.waited == [True] * 3  # the setter ran while the waiter blocked
    assert len(waiter.threads) == 1 and len(setter.threads) == 1
    assert waiter.threads.isdisjoint(setter.threads)


def test_without_its_own_thread_the_same_callback_would_wait_for_the_one_behind_it() -> None:
    # The check of the test above: pinned to one thread, the waiter runs first and its
    # partner only after it (list order), so every wait times out.
    go = threading.Event()

    class SharedWaiter(Waiter):
        own_thread = False
        patience = 0.5

    waiter, setter = SharedWaiter(go), Setter(go)
    make_trainer(1, callbacks=[waiter, setter], lane_threads=1).fit_sync()
    assert waiter.waited == [False]
    assert waiter.threads == setter.threads


def test_an_event_a_threads_callbacks_do_not_handle_puts_nothing_on_it() -> None:
    class EpochOnly(Callback):
        def epoch_end(self, state: Any, logger: Any) -> None:
            return None

    class EveryBatch(Callback):
        def after_forward(self, state: Any, logger: Any) -> None:
            return None

        def after_loss(self, state: Any, logger: Any) -> None:
            return None

    queued: list[tuple[int, int]] = []
    trainers: list[Any] = []

    class Look(Callback):  # on the training thread, after AFTER_LOSS was published
        @blocking
        def after_backward(self, state: Any, logger: Any) -> None:
            threads = trainers[0].engine._session.threads
            queued.append((len(threads[0].pending), len(threads[1].pending)))

    trainer = make_trainer(3, callbacks=[EpochOnly(), EveryBatch(), Look()], lane_threads=2)
    trainers.append(trainer)
    trainer.fit_sync()
    # EpochOnly's thread holds nothing during a batch: nothing queued, nothing to wake;
    # EveryBatch's holds the batch's two calls, to run at BATCH_END with one wake-up.
    assert queued == [(0, 2)] * 3


def test_a_stuck_handler_abandons_the_callbacks_pinned_behind_it_with_one_warning() -> None:
    # At the close the bus waits for each lane thread once (one FIFO for its callbacks):
    # a handler stuck there holds up every callback pinned behind it, so all of them are
    # abandoned at that deadline, and one warning names the stuck one and those behind it.
    release = threading.Event()
    closed: list[str] = []

    class Stuck(Callback):
        def fit_end(self, state: Any, logger: Any) -> None:
            release.wait(WATCHDOG)

    class Behind(Callback):
        def fit_end(self, state: Any, logger: Any) -> None:
            return None

        def close(self, state: Any, logger: Any) -> None:
            closed.append("Behind")

    class Elsewhere(Callback):  # the pool's other thread: closed as usual
        def fit_end(self, state: Any, logger: Any) -> None:
            return None

        def close(self, state: Any, logger: Any) -> None:
            closed.append("Elsewhere")

    trainer = make_trainer(1, callbacks=[Stuck(), Elsewhere(), Behind()], lane_threads=2,
                           close_timeout=0.5)
    try:
        with pytest.warns(CallbackTimeoutWarning) as caught:
            trainer.fit_sync()
    finally:
        release.set()
    messages = [str(w.message) for w in caught if w.category is CallbackTimeoutWarning]
    assert len(messages) == 1, messages
    assert "Stuck did not finish" in messages[0] and "Stuck.fit_end" in messages[0]
    assert "the 1 pinned to its lane thread" in messages[0] and "Behind)" in messages[0]
    assert closed == ["Elsewhere"]


@pytest.mark.parametrize("value", [0, -1, 2.0, "8", True, None])
def test_lane_threads_must_be_a_positive_int(value: Any) -> None:
    with pytest.raises(ValueError, match="lane_threads="):
        make_trainer(1, lane_threads=value)


def test_own_thread_must_be_a_bool() -> None:
    class Odd(Callback):
        own_thread = "yes"

        def batch_end(self, state: Any, logger: Any) -> None:
            return None

    with pytest.raises(TypeError, match=r"Odd\).own_thread='yes' must be True"):
        make_trainer(1, callbacks=[Odd()])


REFUSED = textwrap.dedent("""
    import resource, threading, sys
    from tests.helpers import make_trainer
    from trainbus import Callback
    from trainbus.bus import LaneThreadError

    class Plain(Callback):
        def batch_end(self, state, logger):
            return None

    trainer = make_trainer(2, callbacks=[Plain() for _ in range(200)], lane_threads=200)
    threading.stack_size(64 * 1024 * 1024)  # each thread reserves 64 MiB of address space
    with open("/proc/self/status") as status:
        vm = next(int(l.split()[1]) for l in status if l.startswith("VmSize")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + 1024 * 1024 * 1024, resource.RLIM_INFINITY))
    try:
        trainer.fit_sync()
    except LaneThreadError as exc:
        print("REFUSED", exc)
        print("THREADS", threading.active_count())
        sys.exit(0)
    print("NOT REFUSED")
""")


@pytest.mark.slow  # a child process that imports torch
def test_a_thread_the_system_refuses_fails_the_fit_with_the_limit_named() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    proc = subprocess.run([sys.executable, "-c", REFUSED], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "REFUSED" in out, out
    assert "lane_threads" in out and "RLIMIT_NPROC" in out, out
    threads = int(out.split("THREADS")[1].split()[0])
    assert threads <= 2, out  # the lane threads started before the refusal were stopped
