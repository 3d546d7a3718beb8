"""Issue 12: while a barrier or a close has waited longer than ``wait_warning``, a warning
names the callback and the handler it waits for (``CallbackTimeoutWarning``), and waiting
goes on: the warning does not abandon anything, and, drawn from timings, it never stops
training, even where warnings are errors (D7).

The handlers below are slow on purpose (0.6 s against a 0.1 s threshold): their slowness
is the behaviour under test, not a synchronisation.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

import anyio
import pytest

from tests.helpers import make_trainer
from trainbus import Callback, CallbackTimeoutWarning

SLOW = 0.6
THRESHOLD = 0.1


class SlowBatchEnd(Callback):
    def __init__(self) -> None:
        self.calls = 0

    def batch_end(self, state: Any, logger: Any) -> None:
        self.calls += 1
        if self.calls == 1:  # only the first batch waits long
            time.sleep(SLOW)


class SlowAsyncBatchEnd(Callback):
    async def batch_end(self, state: Any, logger: Any) -> None:
        await anyio.sleep(SLOW)


class SlowClose(Callback):
    def close(self, state: Any, logger: Any) -> None:
        time.sleep(SLOW)


def _messages(record: pytest.WarningsRecorder) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, CallbackTimeoutWarning)]


@pytest.mark.parametrize("callback", [SlowBatchEnd, SlowAsyncBatchEnd])
def test_a_long_barrier_wait_names_the_callback_and_the_event(callback: type[Callback]) -> None:
    cb = callback()
    with pytest.warns(CallbackTimeoutWarning) as record:
        make_trainer(1, callbacks=[cb], wait_warning_seconds=THRESHOLD).fit_sync()
    (message,) = _messages(record)
    assert "barrier of Event.BATCH_END" in message, message
    assert f"{callback.__name__} (running {callback.__name__}.batch_end)" in message, message
    assert "keeps waiting" in message
    # The warning points at the user's callback, not at trainbus's own code.
    assert record[0].filename.endswith("test_wait_warning.py")


def test_a_long_wait_where_warnings_are_errors_is_shown_and_training_goes_on() -> None:
    trainer = make_trainer(3, callbacks=[SlowBatchEnd()], wait_warning_seconds=THRESHOLD)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("error")
        trainer.fit_sync()
    assert int(trainer.state.timer.batch) == 3
    assert [w for w in record if issubclass(w.category, CallbackTimeoutWarning)]


def test_a_long_close_names_the_callback_and_still_closes_it() -> None:
    cb = SlowClose()
    with pytest.warns(CallbackTimeoutWarning) as record:
        make_trainer(1, callbacks=[cb], wait_warning_seconds=THRESHOLD).fit_sync()
    (message,) = _messages(record)
    assert "closing has waited" in message and "SlowClose.close" in message, message
    assert "abandoned" not in message.split(";")[0]  # a warning, not an abandonment


def test_no_warning_under_the_threshold() -> None:
    make_trainer(1, callbacks=[SlowClose()], wait_warning_seconds=math.inf).fit_sync()


@pytest.mark.parametrize("value", [0, -1.0, math.nan, "10", True])
def test_wait_warning_must_be_positive_seconds(value: Any) -> None:
    with pytest.raises(ValueError, match="wait_warning"):
        make_trainer(1, wait_warning_seconds=value)
