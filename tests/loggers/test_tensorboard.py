"""TensorBoardLogger: event files read back with TensorBoard's own reader."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers import make_trainer
from trainbus import Callback, TrainbusWarning
from trainbus.callbacks import CheckpointSaver
from trainbus.loggers import InMemoryLogger, TensorBoardLogger


def load(log_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def text_of(acc: EventAccumulator, tag: str) -> list[str]:
    return [e.tensor_proto.string_val[0].decode() for e in acc.Tensors(f"{tag}/text_summary")]


class Extras(Callback):
    def fit_start(self, state: Any, logger: Any) -> None:
        logger.log_hyperparameters({"lr": 0.1, "optimizer": "sgd"})

    def batch_end(self, state: Any, logger: Any) -> None:
        if int(state.timer.batch) == 2:
            logger.log_metrics(
                {"weights": torch.arange(6.0), "note": "hello", "flag": True, "n": 3}
            )


@pytest.mark.anyio
async def test_scalars_steps_and_wall_times_read_back(tmp_path: Path) -> None:
    memory = InMemoryLogger()
    trainer = make_trainer(
        3, 2, [Extras()], eval_batches=2, loggers=[TensorBoardLogger(tmp_path / "tb"), memory]
    )
    await trainer.fit()
    acc = load(tmp_path / "tb")
    loss = acc.Scalars("loss/train")
    assert [e.step for e in loss] == [1, 2, 3, 4, 5, 6]
    expected = [v for _, _, v in memory.data["loss/train"]]
    assert [e.value for e in loss] == pytest.approx(expected, rel=1e-6)  # float32 on disk
    walls = [e.wall_time for e in loss]
    assert walls == sorted(walls)
    assert [e.step for e in acc.Scalars("eval/loss")] == [3, 6]
    assert [(e.step, e.value) for e in acc.Scalars("flag")] == [(2, 1.0)]
    assert [(e.step, e.value) for e in acc.Scalars("n")] == [(2, 3.0)]
    (hist,) = acc.Histograms("weights")
    assert (hist.step, hist.histogram_value.num, hist.histogram_value.sum) == (2, 6, 15.0)
    assert text_of(acc, "note") == ["hello"]
    (table,) = text_of(acc, "hyperparameters")
    assert "| lr | 0.1 |" in table
    assert "| optimizer | sgd |" in table


class FailsAtBatch(Callback):
    def batch_end(self, state: Any, logger: Any) -> None:
        if int(state.timer.batch) == 2:
            raise RuntimeError("callback failed")


def test_close_after_a_failure_keeps_every_point(tmp_path: Path) -> None:
    trainer = make_trainer(
        8, 1, [FailsAtBatch()], loggers=[TensorBoardLogger(tmp_path, flush_seconds=3600)]
    )
    with pytest.raises(RuntimeError, match="callback failed"):
        trainer.fit_sync()
    assert [e.step for e in load(tmp_path).Scalars("loss/train")] == [1, 2]


def test_missing_tensorboard_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'trainbus\[tensorboard\]'"):
        TensorBoardLogger(tmp_path)


def test_missing_writer_names_the_extra_when_the_logger_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer is imported by the constructor, on the caller's thread: a missing one is
    an error there, not a failed ``fit_start`` inside a fit."""
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ImportError, match=r"pip install 'trainbus\[tensorboard\]'"):
        TensorBoardLogger(tmp_path)


def test_import_trainbus_loggers_does_not_import_tensorboard() -> None:
    code = (
        "import sys, trainbus, trainbus.loggers\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] == 'tensorboard'"
        " or m.startswith('torch.utils.tensorboard')]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("bad", [0, -1, "10", float("nan")])
def test_bad_flush_secs(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(ValueError, match="flush_seconds"):
        TensorBoardLogger(tmp_path, flush_seconds=bad)


def test_bad_log_dir() -> None:
    with pytest.raises(TypeError, match="log_dir=None"):
        TensorBoardLogger(None)  # type: ignore[arg-type]


class Attempt(Callback):
    """Logs ``half`` = batch / 2 + ``offset``: a value that tells which run logged it."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def batch_end(self, state: Any, logger: Any) -> None:
        logger.log_metrics({"half": int(state.timer.batch) * 0.5 + self.offset})


def test_resumed_from_an_older_checkpoint_writes_each_step_once(tmp_path: Path) -> None:
    """The first run (steps 1-4, checkpoints at 2 and 4) is the killed one; the resumed
    run starts from the checkpoint of step 2 and runs to step 8 with other values.
    TensorBoard's reader sees each step once: the killed run's values up to step 4 (the
    replay rule), the resumed run's after (before: steps 3 and 4 twice)."""
    saver = CheckpointSaver(tmp_path / "ckpt", filename="ba{batch}.pt", save_interval="2ba")
    make_trainer(
        4, 1, [saver, Attempt(0.0)], loggers=[TensorBoardLogger(tmp_path / "tb")]
    ).fit_sync()
    resumed = TensorBoardLogger(tmp_path / "elsewhere")  # a requeue's new folder
    with pytest.warns(TrainbusWarning, match="resuming the run of the checkpoint"):
        trainer = make_trainer(
            4, 2, [Attempt(1000.0)], loggers=[resumed], load_path=tmp_path / "ckpt" / "ba2.pt"
        )
    assert resumed.log_dir == tmp_path / "tb"
    trainer.fit_sync()
    assert not (tmp_path / "elsewhere").exists()
    acc = load(tmp_path / "tb")
    assert [e.step for e in acc.Scalars("loss/train")] == list(range(1, 9))
    half = [(e.step, e.value) for e in acc.Scalars("half")]
    assert half == [(s, s * 0.5 + (0 if s <= 4 else 1000)) for s in range(1, 9)]
