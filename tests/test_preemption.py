"""``Trainer(preemption=...)``: SIGTERM stops at the next batch with a checkpoint and exits 143.

These run in the pytest process (its main thread), with the signal sent by a callback to
the process itself; ``tests/test_crash_consistency.py`` sends it from outside to a child.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import make_trainer
from trainbus import Callback, Preemption, TrainingPreempted
from trainbus.callbacks import CheckpointSaver
from trainbus.loggers import JSONLinesLogger


class SigtermAt(Callback):
    """Sends SIGTERM to this process at one batch's end."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def batch_end(self, state: Any, logger: Any) -> None:
        if int(state.timer.batch) == self.batch:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_checkpoints_where_training_stopped_and_fit_sync_exits_143(
    tmp_path: Path,
) -> None:
    before = signal.getsignal(signal.SIGTERM)
    saver = CheckpointSaver(tmp_path / "ckpt", save_interval="100ba")  # never due by itself
    log = JSONLinesLogger(tmp_path / "m.jsonl")
    trainer = make_trainer(20, callbacks=[saver, SigtermAt(5)], loggers=[log], preemption=True)
    with pytest.raises(TrainingPreempted) as caught:
        trainer.fit_sync()
    assert caught.value.code == 143
    assert trainer.preempted
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is fit()'s only
    stopped = int(trainer.state.timestamp.batch)
    assert 5 <= stopped < 20
    [(timestamp, [_path])] = saver.saved_checkpoints
    assert int(timestamp.batch) == stopped  # the last batch trained on is saved

    saver2 = CheckpointSaver(tmp_path / "ckpt", save_interval="100ba")
    log2 = JSONLinesLogger(tmp_path / "m.jsonl")
    resumed = make_trainer(20, callbacks=[saver2], loggers=[log2], load_path=tmp_path / "ckpt")
    resumed.fit_sync()
    assert int(resumed.state.timestamp.batch) == 20
    steps = [
        json.loads(line)["step"]
        for line in (tmp_path / "m.jsonl").read_text().splitlines()
    ]
    assert steps == list(range(1, 21))  # each batch's loss once


def test_without_preemption_no_handler_is_installed(tmp_path: Path) -> None:
    seen = []

    class Look(Callback):
        def fit_start(self, state: Any, logger: Any) -> None:
            seen.append(signal.getsignal(signal.SIGTERM))

    make_trainer(2, callbacks=[Look()]).fit_sync()
    assert seen == [signal.SIG_DFL]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"signals": (signal.SIGINT,)}, ValueError, "must not include SIGINT"),
        ({"signals": ("TERM",)}, TypeError, "signals="),
        ({"exit_code": 300}, ValueError, "exit_code=300"),
        ({"grace": 0}, ValueError, "grace=0"),
    ],
)
def test_bad_preemption_arguments_name_the_argument(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        Preemption(**kwargs)


def test_preemption_argument_is_checked() -> None:
    with pytest.raises(TypeError, match="preemption="):
        make_trainer(2, preemption="yes")


def test_a_preemption_object_sets_the_exit_status(tmp_path: Path) -> None:
    trainer = make_trainer(
        20, callbacks=[SigtermAt(2)], preemption=Preemption(exit_code=99, grace=5)
    )
    with pytest.raises(TrainingPreempted) as caught:
        trainer.fit_sync()
    assert caught.value.code == 99
