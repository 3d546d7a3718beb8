"""Shared probes of the dispatch tests (SPEC section 3, D1-D13).

Every test of ``tests/dispatch/`` is built to fail if its guarantee broke: handlers meet
inside each other (concurrency without timing), wait for the training thread to publish
a later event (overlap without timing), and lockstep ``@blocking`` probes record what
the training thread sees right after a ``publish`` returns. Where time is inherent (D7's
loop lateness) the check is a ratio with a wide margin.

Async handlers here mostly suspend once with ``await anyio.sleep(0)`` before anything
that may open a cancel scope, so each test checks its own guarantee even if scope
nesting broke (``test_d13_async_handlers_may_suspend_inside_their_own_cancel_scopes``
in ``test_d13_backends.py`` checks that).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import anyio

from trainbus import Callback, Event, Trainer, blocking

__all__ = (
    "E",
    "WATCHDOG",
    "BATCH_EVENTS",
    "EVAL_BATCH_EVENTS",
    "expected",
    "fit",
    "until",
    "nap",
    "batch_of",
    "Progress",
    "Witness",
    "Closes",
)

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
