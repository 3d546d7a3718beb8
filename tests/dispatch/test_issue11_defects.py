"""Regression tests for the defects of issue 11 (and issue 12, point 8), public API only.

1. D1 for logger destinations: a destination's ``@blocking`` plain handler ran while the
   same destination's ``async log_metrics`` was still in flight.
2. The public ``Engine`` validated nothing (``queue_size=0`` hung, ``max_lag=-1`` raised
   ``IndexError`` at the first barrier); ``Engine`` and ``Trainer`` validate alike now.
3. A plain ``def background`` failed only inside ``fit()``; a failing ``background`` was
   reported as raised "while handling a logged record".

Defect 4 (``engine.run_event()`` from plain code is slow) is a timing claim: it is
measured in ``benchmarks/``, not here. A destination failing on every record raises one
error from ``fit()``, not a group of identical ones (issue 12, point 8; D10).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable
from typing import Any

import anyio
import pytest
import torch

from tests.dispatch._probes import WATCHDOG, Closes, batch_of, fit
from tests.helpers import make_trainer
from trainbus import (
    Callback,
    CallbackSignatureError,
    Engine,
    Event,
    Logger,
    LoggerDestination,
    State,
    blocking,
)

# --- defect 1: D1 for logger destinations -----------------------------------------------

# How long an in-flight log_metrics stays in flight once the training thread is about to
# publish AFTER_BACKWARD: a destination's handler that ran meanwhile would run within
# microseconds (it ends the wait at once); a correct bus makes that handler wait it out.
GRACE = 0.1


class Overlap(LoggerDestination):
    """Counts its handlers running at once; its ``after_backward`` is set per test."""

    def __init__(self, about_to_publish: threading.Event) -> None:
        self.about_to_publish = about_to_publish
        self.entered = threading.Event()  # log_metrics has started
        self.overlapped = threading.Event()  # a handler ran while log_metrics was in flight
        self.calls: list[tuple[str, int]] = []
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def enter(self, what: str, n: int) -> None:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.calls.append((what, n))
            if self.active > 1:
                self.overlapped.set()

    def leave(self) -> None:
        with self._lock:
            self.active -= 1

    def handle_event(self, state: Any) -> None:
        self.enter("after_backward", batch_of(state))
        self.leave()


def _after_backward(kind: str) -> Callable[..., Any]:
    def plain(self: Overlap, state: Any, logger: Any) -> None:
        self.handle_event(state)

    async def coro(self: Overlap, state: Any, logger: Any) -> None:
        await anyio.sleep(0)
        self.handle_event(state)

    fn: Any = plain if kind.rpartition("-")[2] == "sync" else coro
    return blocking(fn) if kind.startswith("blocking") else fn


def _log_metrics(kind: str) -> Callable[..., Any]:
    async def coro(self: Overlap, metrics: dict[str, Any], step: int) -> None:
        self.enter("log", step)
        try:
            self.entered.set()
            await anyio.sleep(0)
            while not self.about_to_publish.is_set():  # the training thread, before AFTER_BACKWARD
                await anyio.sleep(0.001)
            with anyio.move_on_after(GRACE):  # ... ends early only if a handler overlapped
                while not self.overlapped.is_set():
                    await anyio.sleep(0.001)
        finally:
            self.leave()

    def plain(self: Overlap, metrics: dict[str, Any], step: int) -> None:
        self.enter("log", step)
        try:
            self.entered.set()
            assert self.about_to_publish.wait(WATCHDOG / 2)
            self.overlapped.wait(GRACE)
        finally:
            self.leave()

    return coro if kind == "async" else plain


@pytest.mark.anyio
@pytest.mark.parametrize("record", ["async", "sync"], ids=["async-log_metrics", "sync-log_metrics"])
@pytest.mark.parametrize("handler", ["blocking-sync", "blocking-async", "sync", "async"])
async def test_defect1_a_destination_never_runs_a_handler_while_its_log_metrics_is_in_flight(
    handler: str, record: str
) -> None:
    n = 2
    about_to_publish = threading.Event()
    cls = type(
        "Dest",
        (Overlap,),
        {"after_backward": _after_backward(handler), "log_metrics": _log_metrics(record)},
    )
    dest = cls(about_to_publish)

    class Logs(Callback):
        @blocking  # the training thread: log, then wait until the record is in flight
        def after_forward(self, state: Any, logger: Any) -> None:
            about_to_publish.clear()
            dest.entered.clear()
            logger.log_metrics({"x": batch_of(state)}, step=batch_of(state))
            assert dest.entered.wait(WATCHDOG / 2), "the record never reached log_metrics"

        @blocking  # the training thread, right before it publishes AFTER_BACKWARD
        def before_backward(self, state: Any, logger: Any) -> None:
            about_to_publish.set()

    trainer = make_trainer(
        n, callbacks=[Logs()], loggers=[dest], log_train_loss=False
    )
    await fit(trainer)
    assert not dest.overlapped.is_set(), f"ran two handlers at once: {dest.calls}"
    assert dest.max_active == 1
    assert dest.calls == [(what, b) for b in range(n) for what in ("log", "after_backward")]


# --- defect 2: Engine and Trainer validate the bus's arguments alike ---------------------


def build_engine(**kw: Any) -> object:
    state = State(model=torch.nn.Linear(1, 1), max_duration="1ep")
    return Engine(state, Logger(state), [], **kw)


def build_trainer(**kw: Any) -> object:
    return make_trainer(1, **kw)


BAD_ARGUMENTS = [
    pytest.param({"queue_size": 0}, ValueError, id="queue_size=0"),
    pytest.param({"queue_size": -3}, ValueError, id="queue_size=-3"),
    pytest.param({"queue_size": 1.5}, (TypeError, ValueError), id="queue_size=1.5"),
    pytest.param({"queue_size": "3"}, (TypeError, ValueError), id="queue_size='3'"),
    pytest.param({"max_lag": -1}, ValueError, id="max_lag=-1"),
    pytest.param({"max_lag": 1.5}, (TypeError, ValueError), id="max_lag=1.5"),
    pytest.param({"close_timeout": math.nan}, ValueError, id="close_timeout=nan"),
    pytest.param({"wait_warning_seconds": -1}, ValueError, id="wait_warning_seconds=-1"),
    pytest.param({"barriers": ("batch_ends",)}, ValueError, id="barriers=('batch_ends',)"),
]


@pytest.mark.parametrize("build", [build_engine, build_trainer], ids=["Engine", "Trainer"])
@pytest.mark.parametrize(("kw", "error"), BAD_ARGUMENTS)
def test_defect2_bad_bus_arguments_raise_at_construction_naming_argument_and_fix(
    build: Callable[..., object], kw: dict[str, Any], error: type[Exception]
) -> None:
    (name,) = kw
    with pytest.raises(error) as info:
        build(**kw)
    message = str(info.value)
    assert f"{name}=" in message, message  # names the argument (and the value given)
    assert re.search(r"e\.g\.|use ", message), f"no fix suggested: {message}"
    if name == "barriers":  # lists the valid names
        missing = [e.value for e in Event if e.value not in message and e.name not in message]
        assert not missing, f"valid barrier names not listed ({missing}): {message}"


@pytest.mark.parametrize(("kw", "error"), BAD_ARGUMENTS)
def test_defect2_engine_and_trainer_validate_in_one_place(
    kw: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error) as from_engine:
        build_engine(**kw)
    with pytest.raises(error) as from_trainer:
        build_trainer(**kw)
    assert type(from_engine.value) is type(from_trainer.value)
    assert str(from_engine.value) == str(from_trainer.value)


# --- defect 3: background is checked at construction; its failures name it ---------------


class PlainBackground(Callback):
    def background(self, state: Any, logger: Any) -> None:  # must be async def
        pass


class PlainBackgroundDestination(LoggerDestination):
    def background(self, state: Any, logger: Any) -> None:
        pass


@pytest.mark.parametrize("where", ["Trainer-callbacks", "Trainer-loggers", "Engine"])
def test_defect3_a_plain_background_is_rejected_at_construction(where: str) -> None:
    cls: type[Callback] = PlainBackgroundDestination if "loggers" in where else PlainBackground
    with pytest.raises(CallbackSignatureError) as info:
        if where == "Engine":
            build_engine_with(cls())
        elif where == "Trainer-loggers":
            make_trainer(1, loggers=[cls()])
        else:
            make_trainer(1, callbacks=[cls()])
    message = str(info.value)
    assert f"{cls.__qualname__}.background" in message, message
    assert "async def" in message, message


def build_engine_with(callback: Callback) -> Engine:
    state = State(model=torch.nn.Linear(1, 1), max_duration="1ep")
    return Engine(state, Logger(state), [callback])


@pytest.mark.anyio
@pytest.mark.parametrize("base", [Callback, LoggerDestination], ids=["callback", "destination"])
async def test_defect3_a_failing_background_is_reported_as_raised_by_it(base: type) -> None:
    async def background(self: Any, state: Any, logger: Any) -> None:
        raise ValueError("background boom")

    cls = type("FailingBackground", (Closes, base), {"background": background})
    failing: Any = cls()
    kw: dict[str, Any] = {"loggers": [failing]} if base is LoggerDestination else {}
    trainer = make_trainer(5, callbacks=[] if kw else [failing], **kw)
    with pytest.raises(ValueError, match="background boom") as info:
        await fit(trainer)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "raised by FailingBackground.background" in notes, notes
    assert "logged record" not in notes, notes
    assert (failing.closed, failing.post_closed) == (1, 1)


# --- a destination failing on every record: one error, nothing more of it runs (D10) ----


@pytest.mark.anyio
@pytest.mark.parametrize("record", ["async", "sync"])
async def test_a_destination_failing_on_every_record_raises_one_error(record: str) -> None:
    class AlwaysFails(Closes, LoggerDestination):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def fail(self, step: int) -> None:
            self.calls += 1
            raise ValueError(f"upload failed at step {step}")

    if record == "async":

        async def log_metrics(self: Any, metrics: dict[str, Any], step: int) -> None:
            await anyio.sleep(0)
            self.fail(step)

    else:

        def log_metrics(self: Any, metrics: dict[str, Any], step: int) -> None:
            self.fail(step)

    dest: Any = type("AlwaysFails", (AlwaysFails,), {"log_metrics": log_metrics})()

    class Logs(Callback):
        @blocking
        def after_forward(self, state: Any, logger: Any) -> None:
            for k in range(3):  # several records queued at once, before any was handled
                logger.log_metrics({"k": k})

    trainer = make_trainer(8, callbacks=[Logs()], loggers=[dest])  # + the loss records
    with pytest.raises(ValueError, match="upload failed at step") as info:
        await fit(trainer)  # one error: an ExceptionGroup is not a ValueError
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "AlwaysFails" in notes, notes
    assert dest.calls == 1, f"{dest.calls} records reached the destination after it failed"
    assert (dest.closed, dest.post_closed) == (1, 1)
