"""Composer's ``destination.log_data(state, log_level, data)`` call on the built-in destinations
(issue 54): it records what ``log_record`` would, never nothing.

Composer v0.6's own tests call ``log_data`` on a destination directly; trainbus's built-in
destinations override ``log_record`` only, and the base ``log_data`` was an empty method.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import make_trainer
from tests.loggers.wandb_files import offline_env, wandb_history
from trainbus import LogLevel
from trainbus.loggers import InMemoryLogger, JSONLinesLogger, WandBLogger


def test_log_data_records_on_the_in_memory_logger_as_composers_does() -> None:
    memory = InMemoryLogger(log_level=LogLevel.BATCH)
    trainer = make_trainer(3, loggers=[memory])
    trainer.fit_sync()
    state = trainer.state
    memory.log_data(state, LogLevel.BATCH, {"accuracy": 0.75})
    memory.log_data(state, LogLevel.MICROBATCH, {"dropped": 1.0})  # above its log_level
    assert memory.most_recent_values["accuracy"] == 0.75
    assert memory.most_recent_timestamps["accuracy"] == state.timestamp
    ((timestamp, level, value),) = memory.data["accuracy"]
    assert (timestamp, level, value) == (state.timestamp, LogLevel.BATCH, 0.75)
    assert memory.get_timeseries("accuracy")["step"] == [3]  # the state's batch count
    assert "dropped" not in memory.data


def test_log_data_writes_a_line_to_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    dest = JSONLinesLogger(path)
    trainer = make_trainer(2, loggers=[dest])
    dest.log_data(trainer.state, "epoch", {"before": 2.5})  # before fit: step 0
    trainer.fit_sync()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    first = rows[0]
    assert (first["name"], first["value"], first["step"], first["level"]) == (
        "before", 2.5, 0, "epoch",
    )  # fmt: skip
    assert [row["step"] for row in rows[1:]] == [1, 2]  # the fit's own records follow


def test_log_data_refuses_what_is_not_a_dict_with_the_fix() -> None:
    memory = InMemoryLogger()
    trainer = make_trainer(1, loggers=[memory])
    with pytest.raises(TypeError, match=r"data=0\.5 must be a dict of names to values"):
        memory.log_data(trainer.state, LogLevel.BATCH, 0.5)  # type: ignore[arg-type]


@pytest.fixture
def wandb_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "wb"
    root.mkdir()
    for name, value in offline_env(root).items():
        monkeypatch.setenv(name, value)
    yield root
    import wandb

    wandb.teardown()


@pytest.mark.slow  # an offline W&B run, read back with W&B's reader: ~15 s under load
def test_log_data_logs_to_an_offline_wandb_run(wandb_root: Path) -> None:
    dest = WandBLogger("p", dir=wandb_root)
    trainer = make_trainer(2, loggers=[dest])
    dest.log_data(trainer.state, LogLevel.BATCH, {"composer": 4.0})  # step 0, before fit
    trainer.fit_sync()
    rows = wandb_history(wandb_root)[dest.run_id]
    assert rows[0] == (0, {"composer": 4.0})
    assert [step for step, _ in rows] == [0, 1, 2]
