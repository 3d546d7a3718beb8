"""Composer v0.6 compatibility: callbacks written in Composer's style run unchanged.

The callbacks below are written the way Composer v0.6 callbacks are (sync per-event
methods, ``logger.data_batch``/``data_epoch``, ``Time`` arithmetic on ``state.timer``,
``state.optimizers``, a ``state_dict`` holding a ``deque``); only their imports name
trainbus. They run on a real Trainer and their points arrive in ``InMemoryLogger``.
"""

from __future__ import annotations

from collections import Counter, deque
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import TinyModel, make_loader
from trainbus import Callback, Event, Logger, LogLevel, State, Time, Timestamp, TimeUnit, Trainer
from trainbus.loggers import InMemoryLogger

BATCHES_PER_EPOCH = 3
BATCH_SIZE = 4  # make_loader's default


# --- callbacks in Composer v0.6 style -----------------------------------------------------


class SamplesPerWindow(Callback):
    """Counts samples over a sliding window of batches, like Composer's SpeedMonitor."""

    def __init__(self, window_size: int = 3) -> None:
        super().__init__()
        self.window_size = window_size
        self.batch_num_samples: deque[int] = deque(maxlen=window_size)
        self.batch_start_sample = Time(0, TimeUnit.SAMPLE)
        self.epoch_start_sample = Time(0, TimeUnit.SAMPLE)
        self.reported_batch_sizes: list[int] = []
        self.loaded_state: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"batch_num_samples": self.batch_num_samples, "window_size": self.window_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded_state = state

    def _apply_loaded_state(self) -> None:
        if self.loaded_state is not None:
            self.window_size = self.loaded_state["window_size"]
            self.batch_num_samples = self.loaded_state["batch_num_samples"]
            self.loaded_state = None

    def fit_start(self, state: State, logger: Logger) -> None:
        self._apply_loaded_state()

    def epoch_start(self, state: State, logger: Logger) -> None:
        self.epoch_start_sample = state.timer.sample

    def batch_start(self, state: State, logger: Logger) -> None:
        self.batch_start_sample = state.timer.sample
        self.reported_batch_sizes.append(state.batch_num_samples)

    def batch_end(self, state: State, logger: Logger) -> None:
        self.batch_num_samples.append(int(state.timer.sample - self.batch_start_sample))
        if len(self.batch_num_samples) == self.window_size:
            logger.data_batch({"samples/window": sum(self.batch_num_samples)})

    def epoch_end(self, state: State, logger: Logger) -> None:
        logger.data_epoch(
            lambda: {"samples/epoch": int(state.timer.sample - self.epoch_start_sample)}
        )


class LearningRates(Callback):
    """Logs every param group's learning rate, like Composer's LRMonitor."""

    def batch_end(self, state: State, logger: Logger) -> None:
        for optimizer in state.optimizers:
            name = optimizer.__class__.__name__
            for idx, group in enumerate(optimizer.param_groups):
                logger.data_batch({f"lr-{name}/group{idx}": group["lr"]})


class BestEval(Callback):
    """Tracks the best eval loss from ``state.current_metrics`` and the run's progress."""

    def __init__(self) -> None:
        super().__init__()
        self.best: float | None = None

    def eval_end(self, state: State, logger: Logger) -> None:
        loss = float(state.current_metrics["eval"]["loss"])
        if self.best is None or loss < self.best:
            self.best = loss
        logger.data_epoch({"eval/best_loss": self.best})

    def epoch_end(self, state: State, logger: Logger) -> None:
        logger.data("epoch", {"progress": state.get_elapsed_duration().value})


class RunEventCounter(Callback):
    """Overrides ``run_event`` to see every event, as Composer allows."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[Event] = Counter()
        self.timestamps: list[Timestamp] = []
        self.model_types: set[type] = set()

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        self.counts[event] += 1
        self.model_types.add(type(state.model))
        if event == Event.BATCH_END:
            self.timestamps.append(state.timer.get_timestamp())
        if event == Event.FIT_END:
            logger.data_fit({"events/total": sum(self.counts.values())})


class LinesToFile(Callback):
    """Writes one line per batch to a file opened at ``init`` and closed in ``close``."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.file: Any = None
        self.closed_with: list[str] = []

    def init(self, state: State, logger: Logger) -> None:
        self.file = self.path.open("w")

    def batch_end(self, state: State, logger: Logger) -> None:
        self.file.write(f"{int(state.timer.epoch)} {int(state.timer.batch)}\n")

    def close(self, state: State, logger: Logger) -> None:
        self.file.close()
        self.closed_with.append("close")

    def post_close(self) -> None:
        self.closed_with.append("post_close")


# --- the run --------------------------------------------------------------------------------


def make_composer_style_trainer(
    callbacks: list[Callback], logger: InMemoryLogger, epochs: int = 2
) -> Trainer:
    model = TinyModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    return Trainer(
        model=model,
        train_dataloader=make_loader(BATCHES_PER_EPOCH),
        eval_dataloader=make_loader(2, seed=1),
        max_duration=f"{epochs}ep",
        optimizers=optimizer,
        schedulers=scheduler,
        callbacks=callbacks,
        loggers=[logger],
    )


def rows(logger: InMemoryLogger, name: str) -> list[tuple[int, LogLevel, Any]]:
    """``(batch of the timestamp, level, value)`` for each point logged under ``name``."""
    return [(int(ts.batch), level, value) for ts, level, value in logger.data[name]]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("compat") / "batches.txt"
    callbacks = {
        "samples": SamplesPerWindow(window_size=3),
        "lrs": LearningRates(),
        "best": BestEval(),
        "counter": RunEventCounter(),
        "lines": LinesToFile(path),
    }
    logger = InMemoryLogger()
    trainer = make_composer_style_trainer(list(callbacks.values()), logger)
    trainer.fit_sync()
    return {"trainer": trainer, "logger": logger, "path": path, **callbacks}


def test_data_batch_points_arrive_with_their_batch_and_level(run: dict[str, Any]) -> None:
    # the window fills at batch 3; each of the 6 batches has 4 samples
    assert rows(run["logger"], "samples/window") == [(b, LogLevel.BATCH, 12) for b in (3, 4, 5, 6)]
    assert run["logger"].steps["samples/window"] == [3, 4, 5, 6]


def test_data_epoch_with_a_callable(run: dict[str, Any]) -> None:
    assert rows(run["logger"], "samples/epoch") == [
        (3, LogLevel.EPOCH, 12),
        (6, LogLevel.EPOCH, 12),
    ]
    assert [int(ts.epoch) for ts, _, _ in run["logger"].data["samples/epoch"]] == [1, 2]


def test_state_batch_num_samples(run: dict[str, Any]) -> None:
    assert run["samples"].reported_batch_sizes == [BATCH_SIZE] * 6


def test_learning_rates_read_from_state_optimizers(run: dict[str, Any]) -> None:
    got = rows(run["logger"], "lr-SGD/group0")
    assert [(b, level) for b, level, _ in got] == [(b, LogLevel.BATCH) for b in range(1, 7)]
    # the scheduler steps after every batch; BATCH_END sees the lr after batch n's step
    assert [v for _, _, v in got] == pytest.approx([0.1 * 0.5**b for b in range(1, 7)])


def test_eval_results_in_current_metrics(run: dict[str, Any]) -> None:
    eval_losses = [v for _, _, v in run["logger"].data["eval/loss"]]
    assert len(eval_losses) == 2
    best = rows(run["logger"], "eval/best_loss")
    assert [(b, level) for b, level, _ in best] == [(3, LogLevel.EPOCH), (6, LogLevel.EPOCH)]
    assert [v for _, _, v in best] == pytest.approx([eval_losses[0], min(eval_losses)])
    assert run["best"].best == pytest.approx(min(eval_losses))


def test_get_elapsed_duration(run: dict[str, Any]) -> None:
    assert rows(run["logger"], "progress") == [(3, LogLevel.EPOCH, 0.5), (6, LogLevel.EPOCH, 1.0)]


def test_run_event_override_sees_every_event(run: dict[str, Any]) -> None:
    counts = run["counter"].counts
    assert counts[Event.INIT] == 1
    assert counts[Event.FIT_START] == 1
    assert counts[Event.BATCH_END] == 6
    assert counts[Event.EPOCH_END] == 2
    assert counts[Event.EVAL_END] == 2
    assert counts[Event.FIT_END] == 1
    assert rows(run["logger"], "events/total") == [(6, LogLevel.FIT, sum(counts.values()))]
    assert [int(ts.batch) for ts in run["counter"].timestamps] == [1, 2, 3, 4, 5, 6]
    assert all(isinstance(ts, Timestamp) for ts in run["counter"].timestamps)


def test_state_model_is_the_users_module(run: dict[str, Any]) -> None:
    assert run["counter"].model_types == {TinyModel}
    assert run["trainer"].state.model.__class__ is TinyModel


def test_close_and_post_close(run: dict[str, Any]) -> None:
    assert run["lines"].closed_with == ["close", "post_close"]
    expected = [f"{(b - 1) // BATCHES_PER_EPOCH} {b}" for b in range(1, 7)]
    assert run["path"].read_text().splitlines() == expected


def test_state_dict_with_a_deque_round_trips_and_resumes(
    run: dict[str, Any], tmp_path: Path
) -> None:
    saved = run["samples"].state_dict()
    assert isinstance(saved["batch_num_samples"], deque)
    path = tmp_path / "callback.pt"
    torch.save(saved, path)
    # a deque is not in torch.load's weights_only allow-list: load the full pickle
    loaded = torch.load(path, weights_only=False)

    restored = SamplesPerWindow(window_size=99)
    restored.load_state_dict(loaded)
    logger = InMemoryLogger()
    make_composer_style_trainer([restored], logger, epochs=1).fit_sync()
    assert restored.window_size == 3
    assert isinstance(restored.batch_num_samples, deque)
    assert restored.batch_num_samples.maxlen == 3
    # the window was already full: the resumed callback reports from its first batch
    assert rows(logger, "samples/window") == [(b, LogLevel.BATCH, 12) for b in (1, 2, 3)]


# --- Composer's docstring examples --------------------------------------------------------


class PrintEpoch(Callback):
    def epoch_start(self, state: State, logger: Logger) -> None:
        print(f"Epoch: {int(state.timer.epoch)}")


def test_engine_run_event_from_plain_code(capsys: pytest.CaptureFixture[str]) -> None:
    trainer = make_composer_style_trainer([PrintEpoch()], InMemoryLogger())
    trainer.engine.run_event(Event.EPOCH_START)
    assert capsys.readouterr().out == "Epoch: 0\n"
    trainer.engine.close()
    assert trainer.engine.closed


def test_time_arithmetic_as_composer_callbacks_use_it() -> None:
    now, before = Time(40, TimeUnit.SAMPLE), Time(28, TimeUnit.SAMPLE)
    assert int(now - before) == 12
    assert int(now - 28) == 12
    assert (now - before).unit is TimeUnit.SAMPLE
    assert Time.from_timestring("2ep") == Time(2, TimeUnit.EPOCH)
    assert Time(3, "ba").value == 3
    assert float(Time(0.5, "dur")) == 0.5
