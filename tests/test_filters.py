"""Event filters: ``@every`` / ``@once`` decide on the training thread, before queuing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import make_trainer
from trainbus import Callback, Event, blocking, every, once


class Seen(Callback):
    def __init__(self) -> None:
        self.batches: list[int] = []
        self.epochs: list[int] = []


def test_every_n_batches_on_batch_end() -> None:
    class Cb(Seen):
        @every("2ba")
        def batch_end(self, state: Any, logger: Any) -> None:
            self.batches.append(int(state.timer.batch))

    cb = Cb()
    make_trainer(3, 2, callbacks=[cb]).fit_sync()
    assert cb.batches == [2, 4, 6]


@pytest.mark.anyio
async def test_every_epochs_and_async_handlers() -> None:
    class Cb(Seen):
        @every(2)
        async def epoch_end(self, state: Any, logger: Any) -> None:
            self.epochs.append(int(state.timer.epoch))

    cb = Cb()
    await make_trainer(1, 5, callbacks=[cb]).fit()
    assert cb.epochs == [2, 4]


def test_once_runs_a_single_time_even_where_the_count_repeats() -> None:
    class Cb(Seen):
        @once("1ep")
        def batch_start(self, state: Any, logger: Any) -> None:  # epoch count 1 all epoch 2
            self.batches.append(int(state.timer.batch))

    cb = Cb()
    make_trainer(3, 3, callbacks=[cb]).fit_sync()
    assert cb.batches == [3]


def test_filtered_handlers_are_not_queued_at_all() -> None:
    class Cb(Seen):
        @every("5ba")
        @blocking
        def batch_end(self, state: Any, logger: Any) -> None:
            self.batches.append(int(state.timer.batch))

    cb = Cb()
    trainer = make_trainer(10, callbacks=[cb])
    trainer.fit_sync()
    assert cb.batches == [5, 10]
    assert trainer.engine.statistics().callbacks[0].handled == 2


def test_a_filtered_run_event_override_sees_only_due_events() -> None:
    class Cb(Callback):
        def __init__(self) -> None:
            self.events: list[tuple[Event, int]] = []

        @every("2ba")
        def run_event(self, event: Event, state: Any, logger: Any) -> None:
            if event in (Event.BATCH_END, Event.BATCH_START):
                self.events.append((event, int(state.timer.batch)))

    cb = Cb()
    make_trainer(4, callbacks=[cb]).fit_sync()
    # BATCH_START sees batches completed so far: 2 before the third batch.
    assert cb.events == [
        (Event.BATCH_END, 2), (Event.BATCH_START, 2), (Event.BATCH_END, 4),
    ]


@pytest.mark.parametrize("bad", ["0ba", "10sp", "100tok", "0.5dur", "x"])
def test_bad_intervals_name_the_fix(bad: str) -> None:
    with pytest.raises(ValueError, match="ba"):
        every(bad)
    with pytest.raises(ValueError, match="ba"):
        once(bad)
