"""Composer v0.6's ``FileLogger`` and ``ProgressBarLogger`` port by imports (issue 54).

The two destinations below are written here in the shape of Composer v0.6's (nothing of its
source): what they call and read is what Composer's call and read. ``FileLogger`` writes
one line per ``log_data`` call and, at every flush (``EPOCH_START``, every
``flush_interval`` batches, ``EVAL_START``, ``EPOCH_END``, ``FIT_END``) and at close, calls
``logger.file_artifact(LogLevel.FIT, name, path, overwrite=True)``: that raised before.
``ProgressBarLogger`` sizes its training bar from ``state.steps_per_epoch`` and its
evaluation bar from ``state.evaluators`` (each ``evaluator.dataloader.dataloader``): that
raised ``AttributeError`` before. Both run a fit to the end with Composer's output.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import TinyModel, make_loader
from trainbus import Callback, Logger, LoggerDestination, LogLevel, State, Trainer

BATCHES = 3
EVAL_BATCHES = 2
EPOCHS = 2


def make_trainer(loggers: list[Any], callbacks: Sequence[Any] = (), **kw: Any) -> Trainer:
    model = TinyModel()
    return Trainer(
        model=model,
        train_dataloader=make_loader(BATCHES),
        eval_dataloader=make_loader(EVAL_BATCHES, seed=1),
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        max_duration=f"{EPOCHS}ep",
        loggers=loggers,
        callbacks=list(callbacks),
        run_name="composer-run",
        **kw,
    )


def format_value(value: Any) -> str:
    """Composer's value formatting in outline: floats to 4 places, dicts as ``{ k: v }``."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f'"{k}": {format_value(v)}' for k, v in value.items()) + " }"
    if isinstance(value, torch.Tensor):
        value = value.item()
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


class FileLogger(LoggerDestination):
    """Composer v0.6's ``FileLogger`` in shape: lines at or below ``log_level``, batch lines
    every ``log_interval`` batches, flushes that hand the file to ``logger.file_artifact``."""

    def __init__(
        self, filename: str = "{run_name}/logs.txt", *, log_level: LogLevel = LogLevel.EPOCH,
        log_interval: int = 1, flush_interval: int = 2,
    ) -> None:  # fmt: skip
        self.filename_format = filename
        self.log_level = log_level
        self.log_interval = log_interval
        self.flush_interval = flush_interval
        self.file: Any = None
        self.artifact_name = ""
        self.flushes = 0

    def init(self, state: State, logger: Logger) -> None:
        name = self.filename_format.format(run_name=state.run_name)
        os.makedirs(os.path.dirname(name), exist_ok=True)
        self.artifact_name = name
        self.file = open(name, "x+", buffering=1)  # noqa: SIM115 (closed in close)

    def log_data(self, state: State, log_level: LogLevel, data: dict[str, Any]) -> None:
        if log_level > self.log_level:
            return
        if log_level >= LogLevel.BATCH and (int(state.timer.batch) - 1) % self.log_interval:
            return
        self.file.write(f"[{log_level.name}][batch={int(state.timer.batch)}]: "
                        f"{format_value(data)}\n")  # fmt: skip

    def _flush_file(self, logger: Logger) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        logger.file_artifact(LogLevel.FIT, self.artifact_name, self.file.name, overwrite=True)
        self.flushes += 1

    def epoch_start(self, state: State, logger: Logger) -> None:
        self._flush_file(logger)

    def batch_end(self, state: State, logger: Logger) -> None:
        if int(state.timer.batch) % self.flush_interval == 0:
            self._flush_file(logger)

    def eval_start(self, state: State, logger: Logger) -> None:
        self._flush_file(logger)

    def epoch_end(self, state: State, logger: Logger) -> None:
        if int(state.timer.epoch) % self.flush_interval == 0:
            self._flush_file(logger)

    def fit_end(self, state: State, logger: Logger) -> None:
        self._flush_file(logger)

    def close(self, state: State, logger: Logger) -> None:
        if self.file is not None:
            self._flush_file(logger)
            self.file.close()
            self.file = None


class LogsEachBatch(Callback):
    def batch_end(self, state: State, logger: Logger) -> None:
        logger.data_batch({"samples": int(state.timer.sample)})

    def epoch_end(self, state: State, logger: Logger) -> None:
        logger.data_epoch({"epoch": int(state.timer.epoch)})


def test_composers_file_logger_runs_to_the_end_and_its_artifact_is_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    dest = FileLogger(log_level=LogLevel.BATCH, log_interval=2)
    trainer = make_trainer([dest], [LogsEachBatch()])
    trainer.fit_sync()  # every flush called logger.file_artifact: none raised
    log = tmp_path / "composer-run" / "logs.txt"
    lines = log.read_text().splitlines()
    # Composer's line selection: epoch-level lines always, batch lines every 2nd batch
    # (batches 1, 3, 5), each with the batch count of its event.
    samples = [line for line in lines if '"samples"' in line]
    assert samples == [f"[BATCH][batch={b}]: {{ \"samples\": {b * 4} }}" for b in (1, 3, 5)]
    assert [line for line in lines if '"epoch"' in line] == [
        "[EPOCH][batch=3]: { \"epoch\": 1 }", "[EPOCH][batch=6]: { \"epoch\": 2 }",
    ]  # fmt: skip
    assert any(line.startswith("[EPOCH][batch=3]: { \"eval/loss\": ") for line in lines)
    # The artifact is the log as of the last flush (close): the whole file.
    artifact = tmp_path / "composer-run" / "artifacts" / "composer-run" / "logs.txt"
    assert artifact.read_text() == log.read_text()
    # 2 epoch starts, 3 batch ends (2, 4, 6), 2 eval starts, 1 epoch end (2), fit end, close
    assert dest.flushes == 2 + 3 + 2 + 1 + 1 + 1
    assert capfd.readouterr().err.count("logger.file_artifact stores artifacts") == 1


class ProgressBarLogger(LoggerDestination):
    """Composer v0.6's ``ProgressBarLogger`` in shape: a tqdm bar per epoch, sized by
    ``state.steps_per_epoch``, and one per evaluation, sized by the lengths of the
    ``state.evaluators``' data loaders; batch-level values go to the bar's postfix."""

    KEYS = {True: ("loss/train",), False: ("eval/loss",)}

    def __init__(self, file: Any) -> None:
        self.file = file
        self.pbars: dict[bool, Any] = {}
        self.is_train: bool | None = None
        self.finished: list[tuple[str, int, int]] = []  # (desc, n, total) of each bar

    def log_data(self, state: State, log_level: LogLevel, data: dict[str, Any]) -> None:
        if log_level <= LogLevel.BATCH and self.is_train in self.pbars:
            assert self.is_train is not None
            shown = {k: format_value(v) for k, v in data.items() if k in self.KEYS[self.is_train]}
            if shown:
                self.pbars[self.is_train].set_postfix(shown)

    def _start(self, state: State) -> None:
        import tqdm

        assert self.is_train is not None
        if self.is_train:
            total = state.steps_per_epoch
        else:
            total = sum(len(ev.dataloader.dataloader) for ev in state.evaluators)
        desc = f"Epoch {int(state.timer.epoch)}"
        if not self.is_train:
            desc += f", Batch {int(state.timer.batch)} (val)"
        self.pbars[self.is_train] = tqdm.tqdm(
            total=total, desc=desc, position=0 if self.is_train else 1, file=self.file,
            dynamic_ncols=False, ncols=120,
        )  # fmt: skip

    def _update(self) -> None:
        if self.is_train in self.pbars:
            self.pbars[self.is_train].update(1)

    def _end(self) -> None:
        if self.is_train in self.pbars:
            bar = self.pbars.pop(self.is_train)
            self.finished.append((bar.desc, bar.n, bar.total))
            bar.close()

    def epoch_start(self, state: State, logger: Logger) -> None:
        self.is_train = True
        self._start(state)

    def after_backward(self, state: State, logger: Logger) -> None:
        self._update()

    def epoch_end(self, state: State, logger: Logger) -> None:
        self._end()

    def eval_start(self, state: State, logger: Logger) -> None:
        self.is_train = False
        self._start(state)

    def eval_after_forward(self, state: State, logger: Logger) -> None:
        self._update()

    def eval_end(self, state: State, logger: Logger) -> None:
        self._end()
        self.is_train = True


def test_composers_progress_bar_logger_sizes_its_bars_from_evaluators_and_steps() -> None:
    out = io.StringIO()
    bars = ProgressBarLogger(out)
    trainer = make_trainer([bars])
    assert [e.label for e in trainer.state.evaluators] == ["eval"]
    trainer.fit_sync()
    # Composer's bars: a training bar per epoch over steps_per_epoch batches, an evaluation
    # bar over the evaluators' batches after it, each run to its total.
    assert bars.finished == [
        ("Epoch 0", BATCHES, BATCHES), ("Epoch 1, Batch 3 (val)", EVAL_BATCHES, EVAL_BATCHES),
        ("Epoch 1", BATCHES, BATCHES), ("Epoch 2, Batch 6 (val)", EVAL_BATCHES, EVAL_BATCHES),
    ]  # fmt: skip
    text = out.getvalue()
    assert "Epoch 0: 100%" in text and f"| {BATCHES}/{BATCHES} [" in text
    assert f"| {EVAL_BATCHES}/{EVAL_BATCHES} [" in text
    assert "loss/train=" in text
