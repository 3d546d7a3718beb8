"""ConsoleLogger: interval lines labelled with the logged step, hparams once, streams."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
import torch

from tests.helpers import make_trainer
from trainbus import Callback, Time
from trainbus.loggers import ConsoleLogger, InMemoryLogger
from trainbus.loggers.console import format_value

LINE = re.compile(r"^\[epoch (\d+) batch (\d+)\] (.*)$")


def parse(text: str) -> list[tuple[int, int, dict[str, str]]]:
    """Metric lines as ``(epoch, batch, {name: text})``; other lines are skipped."""
    rows = []
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            pairs = dict(part.split("=", 1) for part in m.group(3).split(" "))
            rows.append((int(m.group(1)), int(m.group(2)), pairs))
    return rows


def test_batch_interval_prints_every_nth_batch_with_its_loss(
    capsys: pytest.CaptureFixture[str],
) -> None:
    memory = InMemoryLogger()
    make_trainer(4, 2, loggers=[ConsoleLogger("2ba"), memory]).fit_sync()
    out = capsys.readouterr().out
    losses = dict(zip(memory.steps["loss/train"], memory.data["loss/train"], strict=True))
    rows = parse(out)
    assert [(e, b) for e, b, _ in rows] == [(1, 2), (1, 4), (2, 6), (2, 8)]
    for _, batch, pairs in rows:
        assert pairs == {"loss/train": f"{losses[batch][2]:.4f}"}
    assert out.splitlines()[0] == f"[epoch 1 batch 2] loss/train={losses[2][2]:.4f}"


@pytest.mark.parametrize("interval", ["1ep", 1, Time(1, "ep")])
def test_epoch_interval_prints_the_latest_values_once_per_epoch(
    capsys: pytest.CaptureFixture[str], interval: Any
) -> None:
    memory = InMemoryLogger()
    make_trainer(3, 2, loggers=[ConsoleLogger(interval), memory]).fit_sync()
    rows = parse(capsys.readouterr().out)
    last = {
        step: v
        for step, (_, _, v) in zip(
            memory.steps["loss/train"], memory.data["loss/train"], strict=True
        )
    }
    assert rows == [
        (1, 3, {"loss/train": f"{last[3]:.4f}"}),
        (2, 6, {"loss/train": f"{last[6]:.4f}"}),
    ]


def test_every_second_epoch(capsys: pytest.CaptureFixture[str]) -> None:
    make_trainer(1, 4, loggers=[ConsoleLogger("2ep")]).fit_sync()
    assert [(e, b) for e, b, _ in parse(capsys.readouterr().out)] == [(2, 2), (4, 4)]


def test_eval_results_print_at_eval_end_with_the_step_they_were_logged_at(
    capsys: pytest.CaptureFixture[str],
) -> None:
    make_trainer(3, 2, eval_batches=2, loggers=[ConsoleLogger("1ep")]).fit_sync()
    rows = parse(capsys.readouterr().out)
    assert [(e, b, sorted(p)) for e, b, p in rows] == [
        (1, 3, ["eval/loss", "loss/train"]),
        (2, 6, ["eval/loss", "loss/train"]),
    ]


class LogsAtBatchEnd(Callback):
    def batch_end(self, state: Any, logger: Any) -> None:
        logger.log_metrics({"cb/batch": int(state.timer.batch)})


def test_points_from_batch_end_handlers_land_on_their_batch_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    make_trainer(3, 1, [LogsAtBatchEnd()], loggers=[ConsoleLogger("1ba")]).fit_sync()
    rows = parse(capsys.readouterr().out)
    assert [(b, p["cb/batch"], list(p)) for _, b, p in rows] == [
        (1, "1", ["loss/train", "cb/batch"]),
        (2, "2", ["loss/train", "cb/batch"]),
        (3, "3", ["loss/train", "cb/batch"]),
    ]


class HParams(Callback):
    def fit_start(self, state: Any, logger: Any) -> None:
        logger.log_hyperparameters({"lr": 0.1, "batch_size": 4, "opt": "sgd"})
        logger.log_hyperparameters({"lr": 0.1, "batch_size": 4})  # nothing new
        logger.log_hyperparameters({"lr": 0.05})


def test_hyperparameters_print_once_and_again_only_when_changed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    make_trainer(1, 1, [HParams()], loggers=[ConsoleLogger("1ep")]).fit_sync()
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if line.startswith("[hparams]")] == [
        "[hparams] lr=0.1 batch_size=4 opt=sgd",
        "[hparams] lr=0.05",
    ]


class FailsAtBatch(Callback):
    def __init__(self, batch: int) -> None:
        self.batch = batch

    def batch_end(self, state: Any, logger: Any) -> None:
        if int(state.timer.batch) == self.batch:
            logger.log_metrics({"cb/last": 1.5})
            raise RuntimeError("boom")


class LogsInClose(Callback):
    def close(self, state: Any, logger: Any) -> None:
        logger.log_metrics({"final/score": 0.75}, step=99)


def test_close_prints_what_is_pending_after_a_failure_and_what_close_logged() -> None:
    stream = io.StringIO()
    trainer = make_trainer(
        5, 1, [FailsAtBatch(2), LogsInClose()], loggers=[ConsoleLogger("10ba", stream)]
    )
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit_sync()
    rows = parse(stream.getvalue())
    assert [(b, sorted(p)) for _, b, p in rows] == [(2, ["cb/last", "loss/train"])]
    assert stream.getvalue().splitlines()[-1] == "[epoch 1 step 99] final/score=0.7500"


def test_stderr_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    make_trainer(1, 1, loggers=[ConsoleLogger("1ep", stream="stderr")]).fit_sync()
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("[epoch 1 batch 1] loss/train=")


@pytest.mark.parametrize("bad", ["10sp", "0.5dur", "0ba", 0, "often"])
def test_bad_interval_names_the_argument(bad: Any) -> None:
    with pytest.raises(ValueError, match="log_interval"):
        ConsoleLogger(bad)


def test_bad_stream() -> None:
    with pytest.raises(ValueError, match=r"stream='out'.*'stdout', 'stderr'"):
        ConsoleLogger(stream="out")
    with pytest.raises(TypeError, match="no write"):
        ConsoleLogger(stream=42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.41234, "0.4123"),
        (0.0, "0.0000"),
        (3, "3"),
        (True, "True"),
        (1.5e-7, "1.5000e-07"),
        (123456.0, "1.2346e+05"),
        (float("nan"), "nan"),
        (float("-inf"), "-inf"),
        (torch.tensor([1.0, 2.5]), "[1.0000,2.5000]"),
        (torch.zeros(2, 3), "tensor(shape=(2, 3))"),
        ("x" * 50, "x" * 37 + "..."),
    ],
)
def test_format_value(value: Any, text: str) -> None:
    assert format_value(value) == text
