"""A logger destination written the Composer v0.6 way ports by changing its imports.

``ComposerStyleLogger`` below is written as a Composer v0.6 destination is: it implements
``log_data(state, log_level, data)``, reads ``logger.run_name`` and
``state.steps_per_epoch`` at ``INIT``, keeps ``state.timer.get_timestamp()`` with each
point and builds its time series from ``timestamp._fields`` / ``_asdict()`` as Composer's
``InMemoryLogger.get_timeseries`` does. Only its imports name trainbus.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import TinyModel, make_loader
from trainbus import Callback, Logger, LoggerDestination, LogLevel, State, Timestamp, Trainer
from trainbus.loggers import InMemoryLogger

BATCHES = 3
BATCH_SIZE = 4  # make_loader's default
EPOCHS = 2


class ComposerStyleLogger(LoggerDestination):
    """Keeps every point at or below ``log_level``, with its timestamp."""

    def __init__(self, log_level: LogLevel = LogLevel.BATCH) -> None:
        super().__init__()
        self.log_level = log_level
        self.run_name = None
        self.steps_per_epoch = None
        self.points: list[tuple[Timestamp, LogLevel, dict[str, Any]]] = []
        self.arguments: list[tuple[type, type]] = []

    def init(self, state: State, logger: Logger) -> None:
        self.run_name = logger.run_name
        self.steps_per_epoch = state.steps_per_epoch

    def log_data(self, state: State, log_level: LogLevel, data: dict[str, Any]) -> None:
        self.arguments.append((type(state), type(log_level)))
        if log_level > self.log_level:
            return
        self.points.append((state.timer.get_timestamp(), log_level, dict(data)))

    def get_timeseries(self, metric: str) -> dict[str, list[Any]]:
        series: dict[str, list[Any]] = {field: [] for field in Timestamp._fields}
        series[metric] = []
        for timestamp, _, data in self.points:
            if metric not in data:
                continue
            for field, time in timestamp._asdict().items():
                series[field].append(time.value)
            series[metric].append(data[metric])
        return series


class LogsAsComposerCallbacksDo(Callback):
    """Composer-style logging calls at FIT_START, every BATCH_END and every EPOCH_END."""

    def fit_start(self, state: State, logger: Logger) -> None:
        logger.data_fit({"lr": 0.1})

    def batch_end(self, state: State, logger: Logger) -> None:
        logger.data_batch({"samples": int(state.timer.sample)})

    def epoch_end(self, state: State, logger: Logger) -> None:
        logger.data_epoch(lambda: {"epoch": int(state.timer.epoch)})


def expected_points() -> list[tuple[dict[str, int], LogLevel, dict[str, Any]]]:
    """Every point the run logs, in logged order, with the counters of its event."""

    def counters(epoch: int, batch: int, in_epoch: int) -> dict[str, int]:
        return {"epoch": epoch, "batch": batch, "batch_in_epoch": in_epoch,
                "sample": batch * BATCH_SIZE, "sample_in_epoch": in_epoch * BATCH_SIZE,
                "token": 0, "token_in_epoch": 0}  # fmt: skip

    points = [(counters(0, 0, 0), LogLevel.FIT, {"lr": 0.1})]
    for epoch in range(EPOCHS):
        for i in range(1, BATCHES + 1):
            batch = epoch * BATCHES + i
            points.append((counters(epoch, batch, i), LogLevel.BATCH,
                           {"samples": batch * BATCH_SIZE}))  # fmt: skip
        points.append(
            (counters(epoch + 1, (epoch + 1) * BATCHES, 0), LogLevel.EPOCH, {"epoch": epoch + 1})
        )
    return points


@pytest.fixture(scope="module")
def ported() -> tuple[Trainer, ComposerStyleLogger, ComposerStyleLogger]:
    model = TinyModel()
    batch_only, fit_only = ComposerStyleLogger(), ComposerStyleLogger(LogLevel.FIT)
    trainer = Trainer(
        model,
        make_loader(BATCHES),
        f"{EPOCHS}ep",
        callbacks=[LogsAsComposerCallbacksDo()],
        loggers=[batch_only, fit_only, InMemoryLogger()],
        log_train_loss=False,  # only the callback logs: one lane, so one logged order
        run_name="composer-port",
        device="cpu",
    )
    trainer.fit_sync()
    return trainer, batch_only, fit_only


def test_every_record_arrives_once_in_order_with_composers_arguments(
    ported: tuple[Trainer, ComposerStyleLogger, ComposerStyleLogger],
) -> None:
    _, dest, _ = ported
    got = [(ts.state_dict(), level, data) for ts, level, data in dest.points]
    assert got == expected_points()
    # log_data(state, log_level, data): a State (a snapshot of the record's event) and a
    # LogLevel, for every record, filtered levels included.
    assert len(dest.arguments) == len(expected_points())
    assert all(issubclass(s, State) and lvl is LogLevel for s, lvl in dest.arguments)


def test_logger_run_name_and_state_steps_per_epoch(
    ported: tuple[Trainer, ComposerStyleLogger, ComposerStyleLogger],
) -> None:
    trainer, dest, fit_only = ported
    assert dest.run_name == fit_only.run_name == "composer-port" == trainer.state.run_name
    assert dest.steps_per_epoch == BATCHES
    assert trainer.logger.destinations == tuple(trainer.state.callbacks[1:])


def test_a_destinations_own_level_filter_sees_each_records_level(
    ported: tuple[Trainer, ComposerStyleLogger, ComposerStyleLogger],
) -> None:
    _, _, fit_only = ported
    assert [(ts.state_dict(), lvl, d) for ts, lvl, d in fit_only.points] == expected_points()[:1]


def test_timeseries_built_from_timestamp_fields(
    ported: tuple[Trainer, ComposerStyleLogger, ComposerStyleLogger],
) -> None:
    trainer, dest, _ = ported
    series = dest.get_timeseries("samples")
    assert series["samples"] == [4 * b for b in range(1, EPOCHS * BATCHES + 1)]
    assert series["batch_in_epoch"] == [1, 2, 3, 1, 2, 3]
    assert series["sample_in_epoch"] == [4, 8, 12, 4, 8, 12]
    # trainbus's own InMemoryLogger returns the same keys (and the step).
    memory = trainer.state.callbacks[-1]
    assert isinstance(memory, InMemoryLogger)
    ours = memory.get_timeseries("samples")
    assert {k: v for k, v in ours.items() if k != "step"} == series
    assert ours["step"] == series["batch"]


class FileLogger(LoggerDestination):
    """Composer v0.6's ``FileLogger`` in outline, as a port by imports keeps it: one line per
    ``log_data`` call, ``[LEVEL][batch=N]: {data}``, with ``N`` from ``state.timer``."""

    def __init__(self, path: Any, log_level: LogLevel = LogLevel.EPOCH) -> None:
        super().__init__()
        self.path = path
        self.log_level = log_level
        self.file: Any = None

    def init(self, state: State, logger: Logger) -> None:
        self.file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (closed in close)

    def log_data(self, state: State, log_level: LogLevel, data: dict[str, Any]) -> None:
        if log_level > self.log_level:
            return
        values = ", ".join(f'"{k}": {float(v):.4f}' for k, v in sorted(data.items()))
        self.file.write(f"[{log_level.name}][batch={int(state.timer.batch)}]: {{ {values} }}\n")

    def close(self, state: State, logger: Logger) -> None:
        self.file.close()


def test_a_ported_file_logger_writes_composers_lines_but_the_documented_step(tmp_path: Any) -> None:
    """Issue 45: Composer logs a batch's loss before ``timer.on_batch_complete`` (its first
    line is ``[BATCH][batch=0]``); trainbus logs it with the batch counted, at the step of
    every BATCH_END value of that batch. The difference is on the porting page, with why."""
    import re

    path = tmp_path / "log.txt"
    model = TinyModel()
    trainer = Trainer(
        model=model, train_dataloader=make_loader(BATCHES), max_duration=f"{EPOCHS}ep",
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        loggers=[FileLogger(path, LogLevel.BATCH)], callbacks=[LogsAsComposerCallbacksDo()],
    )
    trainer.fit_sync()
    lines = path.read_text().splitlines()
    losses = [line for line in lines if '"loss/train"' in line]
    assert [re.match(r"\[BATCH\]\[batch=(\d+)\]", line).group(1)  # type: ignore[union-attr]
            for line in losses] == [str(n) for n in range(1, BATCHES * EPOCHS + 1)]
    page = (Path(__file__).parents[1] / "docs" / "porting-from-composer.md").read_text()
    assert "**The first `loss/train` is at batch 1, not batch 0.**" in page
    assert "`[BATCH][batch=1]`" in page and "`[BATCH][batch=0]`" in page


def test_a_connection_opened_in_init_fails_with_a_note_that_says_where_to_open_it(
    tmp_path: Any,
) -> None:
    """Issue 45: Composer runs every handler on the training thread, so a ``sqlite3``
    connection opened in ``__init__`` worked there; here it fails on the callback's thread,
    and the error says where to open it."""
    import sqlite3

    class OpensInInit(Callback):
        def __init__(self) -> None:
            self.db = sqlite3.connect(tmp_path / "db.sqlite")

        def batch_end(self, state: State, logger: Logger) -> None:
            self.db.execute("SELECT 1")

    model = TinyModel()
    opens = OpensInInit()
    trainer = Trainer(
        model=model, train_dataloader=make_loader(BATCHES), max_duration="1ep",
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        callbacks=[opens],
    )
    with pytest.raises(sqlite3.ProgrammingError, match="same thread") as info:
        trainer.fit_sync()
    opens.db.close()  # this thread's: Python 3.13 warns of a connection left open
    notes = "\n".join(getattr(info.value, "__notes__", ()))
    assert "OpensInInit.batch_end" in notes
    assert "init or fit_start" in notes and '"Thread-bound resources"' in notes
    page = (Path(__file__).parents[1] / "docs" / "porting-from-composer.md").read_text()
    assert "### Thread-bound resources" in page
