"""D7 declared placement: where a handler runs follows from its declaration, never from time.

A plain handler runs on its callback's own thread, the same thread for every plain handler
of that callback (and a destination's ``log_record``) for the whole run, however cheap its
calls are; so a thread-bound resource opened in ``fit_start`` works in every later handler.
``async def`` handlers run on the loop, ``@blocking`` ones on the training thread.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

import pytest

from tests.dispatch._probes import fit
from tests.helpers import make_trainer
from trainbus import Callback, Event, LoggerDestination, LogRecord, blocking

pytestmark = pytest.mark.anyio

BATCHES = 320
PER_BATCH = (
    Event.BATCH_START,
    Event.BEFORE_FORWARD,
    Event.AFTER_FORWARD,
    Event.AFTER_LOSS,
    Event.AFTER_BACKWARD,
    Event.BATCH_END,  # the barrier
    Event.BATCH_CHECKPOINT,
)


class CheapPlain(Callback):
    """No-op plain handlers on every per-batch event, noting the thread of each call."""

    def __init__(self) -> None:
        self.threads: dict[Event, set[int]] = {}
        self.calls = 0

    def note(self, event: Event) -> None:
        self.threads.setdefault(event, set()).add(threading.get_ident())
        self.calls += 1


for _event in PER_BATCH:
    setattr(
        CheapPlain,
        _event.value,
        lambda self, state, logger, _e=_event: self.note(_e),
    )


class SqliteRows(Callback):
    """Opens a sqlite3 connection in fit_start (bound to its thread) and writes every batch."""

    def __init__(self) -> None:
        self.db: sqlite3.Connection | None = None
        self.rows = 0

    def fit_start(self, state: Any, logger: Any) -> None:
        self.db = sqlite3.connect(":memory:")
        self.db.execute("create table b (n integer)")

    def after_forward(self, state: Any, logger: Any) -> None:
        assert self.db is not None
        self.db.execute("insert into b values (?)", (int(state.timer.batch),))

    def batch_end(self, state: Any, logger: Any) -> None:
        assert self.db is not None
        self.rows = self.db.execute("select count(*) from b").fetchone()[0]

    def close(self, state: Any, logger: Any) -> None:
        assert self.db is not None
        self.db.close()


class ThreadLocalSink(LoggerDestination):
    """A destination whose plain handlers and log_record share a threading.local."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.records = 0
        self.threads: set[int] = set()

    def fit_start(self, state: Any, logger: Any) -> None:
        self.local.opened = True
        self.threads.add(threading.get_ident())

    def log_record(self, record: LogRecord) -> None:
        assert self.local.opened, "log_record ran on another thread than fit_start"
        self.threads.add(threading.get_ident())
        self.records += 1


class Placed(Callback):
    def __init__(self) -> None:
        self.async_threads: set[int] = set()
        self.blocking_threads: set[int] = set()

    async def after_loss(self, state: Any, logger: Any) -> None:
        self.async_threads.add(threading.get_ident())

    @blocking
    def after_backward(self, state: Any, logger: Any) -> None:
        self.blocking_threads.add(threading.get_ident())


async def test_d7_a_cheap_plain_callbacks_handlers_all_run_on_one_thread_not_training() -> None:
    cheap, rows, sink, placed = CheapPlain(), SqliteRows(), ThreadLocalSink(), Placed()
    training: set[int] = set()

    class Trainer(Callback):
        @blocking
        def before_forward(self, state: Any, logger: Any) -> None:
            training.add(threading.get_ident())

    trainer = make_trainer(
        BATCHES,
        callbacks=[cheap, rows, placed, Trainer()],
        loggers=[sink],
    )
    loop_thread = threading.get_ident()
    await fit(trainer)

    assert cheap.calls == BATCHES * len(PER_BATCH)
    threads = set().union(*cheap.threads.values())
    assert len(threads) == 1, cheap.threads  # one thread, at barrier and other events alike
    assert set(cheap.threads) == set(PER_BATCH)
    (training_thread,) = training
    assert threads.isdisjoint({training_thread, loop_thread})

    assert rows.rows == BATCHES  # the sqlite3 connection worked in every later handler
    assert sink.records >= BATCHES and len(sink.threads) == 1  # log_record on its thread
    assert sink.threads.isdisjoint({training_thread, loop_thread})
    assert placed.async_threads == {loop_thread}
    assert placed.blocking_threads == {training_thread}
