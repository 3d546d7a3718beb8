"""The time account of a fit (``training/account.py``): its parts add up to the wall time,
a slow plain callback's wait is charged to it (not to compute), a trailing upload shows as
hidden, a resume shows the batches trained again, and the account is logged as metrics."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.helpers import TinyModel, make_loader, make_trainer
from trainbus import Callback, State, TimeAccount, Trainer, trailing
from trainbus.callbacks import CheckpointSaver
from trainbus.loggers import InMemoryLogger, JSONLinesLogger

SLEEP = 0.02
#: The parts add up to the wall time within this share of it: they partition the training
#: thread's timeline, so only rounding and a clamped bus residual can leave a gap.
TOLERANCE = 0.01


def assert_adds_up(acct: TimeAccount) -> None:
    parts = acct.parts()
    assert all(v >= 0 for v in parts.values()), parts
    assert abs(sum(parts.values()) - acct.wall) <= TOLERANCE * acct.wall, (parts, acct.wall)


class SlowPlain(Callback):
    """A plain (not trailing) handler that sleeps at every BATCH_END (a barrier)."""

    def batch_end(self, state: State, logger: Any) -> None:
        time.sleep(SLEEP)


def test_parts_add_up_to_the_wall_time() -> None:
    trainer = make_trainer(8, epochs=2, eval_batches=2)
    trainer.fit_sync()
    acct = trainer.time_account
    assert acct is not None and not acct.running
    assert_adds_up(acct)
    assert acct.batches == 16
    assert acct.startup > 0 and acct.compute > 0 and acct.evaluation > 0 and acct.close > 0
    assert acct.replayed == 0 and acct.replayed_batches == 0
    assert acct.device_compute is None  # CPU


def test_a_slow_plain_callback_is_charged_for_its_wait_not_compute() -> None:
    n = 10
    slow = SlowPlain()
    trainer = make_trainer(n, callbacks=[slow])  # slow on purpose (warned, never raised)
    trainer.fit_sync()
    acct = trainer.time_account
    assert acct is not None
    assert_adds_up(acct)
    (mine,) = [cb for cb in acct.per_callback if cb.name == "SlowPlain"]
    # Every batch's barrier waited for the sleep: at least the sleeps, less the part of
    # each that ran while the training thread was still publishing.
    assert mine.waited >= 0.8 * n * SLEEP
    assert acct.callbacks >= mine.waited
    # The parts partition the wall time, so that wait is not also in compute.
    assert acct.compute + acct.callbacks <= acct.wall
    assert mine.off_thread >= n * SLEEP  # the handler ran on its lane thread
    assert mine.hidden <= 0.2 * mine.off_thread  # the training thread waited for it all


class TrailingUpload(Callback):
    """An ``async def`` upload that may trail 2 batches (5 ms a call); each call tells the
    loader that it finished."""

    def __init__(self) -> None:
        self.done: list[threading.Event] = []

    @trailing(2)
    async def batch_end(self, state: State, logger: Any) -> None:
        await anyio.sleep(0.005)
        self.done[int(state.timestamp.batch) - 1].set()


class PacedLoader:
    """Yields batch k once the upload of batch k - 2 finished: the training thread never
    reaches a barrier that would wait for the upload (it is 2 batches behind at most)."""

    def __init__(self, upload: TrailingUpload, n: int) -> None:
        self.batches = list(make_loader(n))
        self.upload = upload
        upload.done = [threading.Event() for _ in range(n)]

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Any:
        for k, batch in enumerate(self.batches):
            if k >= 2:
                assert self.upload.done[k - 2].wait(30)
            yield batch


def test_a_trailing_async_upload_shows_as_hidden() -> None:
    n = 10
    upload = TrailingUpload()
    model = TinyModel()
    trainer = Trainer(model, PacedLoader(upload, n), "1ep", callbacks=[upload])
    trainer.fit_sync()
    acct = trainer.time_account
    assert acct is not None
    assert_adds_up(acct)
    (mine,) = [cb for cb in acct.per_callback if cb.name == "TrailingUpload"]
    assert mine.waited == 0.0
    assert mine.off_thread >= n * 0.005
    # Everything it did while the loop ran was hidden (at least the first n - 2 uploads;
    # the last two may finish while fit() closes, which is ``close``, not hidden).
    assert mine.hidden >= (n - 2) * 0.005
    assert acct.hidden >= mine.hidden


class Killer(Callback):
    """Fails the run at the end of batch ``at`` (a crash after a checkpoint)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def batch_end(self, state: State, logger: Any) -> None:
        if int(state.timestamp.batch) == self.at:
            raise RuntimeError("killed")


def test_a_resume_shows_the_replayed_batches(tmp_path: Path) -> None:
    folder, metrics = tmp_path / "ckpt", tmp_path / "metrics.jsonl"

    def trainer(callbacks: list[Callback], **kw: Any) -> Trainer:
        return make_trainer(
            12, callbacks=[CheckpointSaver(folder, save_interval="4ba"), *callbacks],
            loggers=[JSONLinesLogger(metrics)], **kw,
        )

    with pytest.raises(RuntimeError, match="killed"):
        trainer([Killer(at=7)]).fit_sync()
    resumed = trainer([], load_path=folder)
    resumed.fit_sync()
    acct = resumed.time_account
    assert acct is not None
    assert_adds_up(acct)
    assert acct.batches == 8  # batches 5 to 12
    assert acct.replayed_batches == 3  # 5, 6 and 7 were trained before the crash
    assert acct.replayed > 0
    (saver,) = [cb for cb in acct.per_callback if cb.name == "CheckpointSaver"]
    assert saver.on_training_thread > 0 and acct.checkpoint > 0


class Peek(Callback):
    """Reads the trainer's account live, from a handler, once."""

    def __init__(self) -> None:
        self.trainer: Trainer | None = None
        self.seen: TimeAccount | None = None

    def batch_end(self, state: State, logger: Any) -> None:
        if int(state.timestamp.batch) == 3 and self.trainer is not None:
            self.seen = self.trainer.time_account


def test_the_account_is_live_during_the_fit() -> None:
    peek = Peek()
    trainer = make_trainer(6, callbacks=[peek])
    peek.trainer = trainer
    assert trainer.time_account is None  # no fit yet
    trainer.fit_sync()
    assert peek.seen is not None and peek.seen.running
    assert 3 <= peek.seen.batches <= 4
    acct = trainer.time_account
    assert acct is not None and not acct.running and acct.batches == 6


def test_the_account_is_logged_as_time_metrics_to_every_destination() -> None:
    a, b = InMemoryLogger(), InMemoryLogger()
    trainer = make_trainer(4, epochs=2, loggers=[a, b], progress=True)
    trainer.fit_sync()
    for dest in (a, b):
        steps = dest.steps["time/compute"]
        assert steps == [4, 8]  # each epoch's end (the fit ends with the second)
        assert dest.steps["time/fit_start"] == [0]
        assert "time/wall" in dest.data and "time/hidden" in dest.data


def test_track_time_false_keeps_no_account() -> None:
    trainer = make_trainer(2, track_time=False)
    trainer.fit_sync()
    assert trainer.time_account is None
    with pytest.raises(TypeError, match="track_time"):
        make_trainer(2, track_time=1)
