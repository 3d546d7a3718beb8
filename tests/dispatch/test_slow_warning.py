"""The slow-callback warning (``SlowCallbackWarning``)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.helpers import make_trainer
from trainbus import Callback, SlowCallbackWarning


class Sluggish(Callback):
    def batch_end(self, state: Any, logger: Any) -> None:
        time.sleep(0.25)  # far longer than a batch of TinyModel, even on a loaded machine


def test_slow_callback_warning_names_the_callback_and_event_once() -> None:
    trainer = make_trainer(5, callbacks=[Sluggish()])  # checked at batches 2-4
    with pytest.warns(SlowCallbackWarning) as record:
        trainer.fit_sync()
    slow = [w for w in record if issubclass(w.category, SlowCallbackWarning)]
    assert len(slow) == 1
    assert "Sluggish" in str(slow[0].message) and "Event.BATCH_END" in str(slow[0].message)


def test_no_slow_callback_warning_when_disabled() -> None:
    make_trainer(5, callbacks=[Sluggish()], warn_slow_callbacks=False).fit_sync()
