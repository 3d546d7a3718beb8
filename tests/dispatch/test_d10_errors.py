"""D10 errors: a handler's failure stops training, closes and is raised with a note."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from tests.dispatch._probes import WATCHDOG, Closes, E, Witness, batch_of, expected, fit, nap
from tests.helpers import EventLog, TinyModel, make_trainer
from trainbus import Callback, Event, blocking

pytestmark = pytest.mark.anyio


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


async def test_d10_a_failed_callback_gets_no_further_handler_calls() -> None:
    class Flaky(Closes):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[tuple[Event, int]] = []

        def after_forward(self, state: Any, logger: Any) -> None:  # always on its thread
            self.calls.append((E.AFTER_FORWARD, batch_of(state)))
            if batch_of(state) == 1:
                raise ValueError("boom")
            time.sleep(0.002)

        def before_loss(self, state: Any, logger: Any) -> None:  # queued behind it
            self.calls.append((E.BEFORE_LOSS, batch_of(state)))

    flaky = [Flaky() for _ in range(3)]  # several, sharing pool threads or not

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
