"""A restart before the first checkpoint: the saver's folder holds the run's start.

A run started with ``load_path`` naming its ``CheckpointSaver``'s folder writes the
destinations' state in that folder (``.trainbus-start.json``) before it logs anything; a run
started again there before any checkpoint resumes its destinations from it, so each holds
every ``(name, step)`` once (``checkpoint/run_start.py``, ``docs/crash-consistency.md``).
Here the first run fails at batch 3, before its checkpoint at batch 4 (a raise, so it
closes; ``tests/test_crash_restart.py`` kills real processes). Before issue 53 the
JSON-lines file, TensorBoard and the server held steps 1-3 twice.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers import make_trainer
from tests.loggers.mlflow_server import MLflowServer
from tests.loggers.test_http_uploader import MetricsServer
from tests.loggers.test_mlflow import history
from trainbus import Callback
from trainbus.callbacks import CheckpointSaver
from trainbus.checkpoint.run_start import START_NAME, read_start
from trainbus.loggers import (
    HTTPMetricsUploader,
    JSONLinesLogger,
    MLflowLogger,
    TensorBoardLogger,
)


class FailAt(Callback):
    """Logs ``half`` = batch / 2 + ``offset`` each batch; raises at batch ``at``."""

    def __init__(self, at: int, offset: float) -> None:
        self.at, self.offset = at, offset

    def batch_end(self, state: Any, logger: Any) -> None:
        batch = int(state.timer.batch)
        logger.log_metrics({"half": batch * 0.5 + self.offset})
        if batch == self.at:
            raise RuntimeError(f"killed at batch {batch}")


def attempt(tmp_path: Path, url: str, *, fail_at: int, offset: float) -> None:
    folder = tmp_path / "ckpt"
    loggers = [
        JSONLinesLogger(tmp_path / "m.jsonl", flush_seconds=0),
        TensorBoardLogger(tmp_path / "tb", flush_seconds=0.1),
        HTTPMetricsUploader(url, spool_dir=tmp_path / "spool", flush_seconds=0.05),
    ]
    saver = CheckpointSaver(folder, filename="ba{batch}.pt", save_interval="4ba")
    trainer = make_trainer(
        6, 1, [saver, FailAt(fail_at, offset)], loggers=loggers, load_path=folder,
        log_train_loss=False,
    )  # fmt: skip
    if fail_at > 6:
        trainer.fit_sync()
        return
    with pytest.raises(RuntimeError, match=f"killed at batch {fail_at}"):
        trainer.fit_sync()
    assert not list(folder.glob("*.pt"))  # no checkpoint yet: a restart starts over


def test_a_restart_before_the_first_checkpoint_keeps_each_step_once(tmp_path: Path) -> None:
    server = MetricsServer()
    try:
        attempt(tmp_path, server.url, fail_at=3, offset=0.0)
        start = (tmp_path / "ckpt" / START_NAME).read_bytes()
        attempt(tmp_path, server.url, fail_at=3, offset=1000.0)
        assert (tmp_path / "ckpt" / START_NAME).read_bytes() == start  # the run's, kept
        attempt(tmp_path, server.url, fail_at=99, offset=2000.0)
    finally:
        server.close()
    expected = {s: s * 0.5 for s in range(1, 4)} | {s: s * 0.5 + 2000 for s in range(4, 7)}
    lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    jsonl = [(r["step"], r["value"]) for r in lines if r["name"] == "half"]
    assert jsonl == sorted(expected.items())  # the first value of each step, once
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert sorted((e.step, e.value) for e in acc.Scalars("half")) == sorted(expected.items())
    stored = Counter(
        (p["step"], p["value"]) for body in server.accepted.values() for p in body["points"]
    )
    assert stored == Counter(expected.items())


def test_the_start_holds_each_destinations_state_before_anything_is_logged(
    tmp_path: Path,
) -> None:
    (tmp_path / "m.jsonl").write_text('{"name":"earlier","step":1}\n')  # another run's line
    folder = tmp_path / "ckpt"
    logger = JSONLinesLogger(tmp_path / "m.jsonl")
    make_trainer(2, 1, [CheckpointSaver(folder)], loggers=[logger], load_path=folder)
    start = read_start(folder)
    assert start is not None
    (state,) = start.destinations.values()
    assert state["position"] == len('{"name":"earlier","step":1}\n')
    assert not [p for p in folder.iterdir() if p.name != START_NAME]  # nothing else yet


def test_no_start_without_load_path_naming_the_savers_folder(tmp_path: Path) -> None:
    logger = JSONLinesLogger(tmp_path / "m.jsonl")
    make_trainer(2, 1, [CheckpointSaver(tmp_path / "a")], loggers=[logger])
    (tmp_path / "c").mkdir()  # another folder, empty: nothing to resume, no start there
    make_trainer(
        2, 1, [CheckpointSaver(tmp_path / "b")], loggers=[logger], load_path=tmp_path / "c"
    )
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert not list((tmp_path / "c").iterdir())


@pytest.mark.slow  # a real mlflow server: ~36 s on a loaded machine
def test_a_restart_before_the_first_checkpoint_continues_the_mlflow_run(
    tmp_path: Path, mlflow_server: MLflowServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow makes its run id when the run is created, after the start is written: the
    restarted logger finds the killed run's MLflow run by its ``trainbus.journal`` tag."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_TOKEN", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    exp, folder, ids = f"restart-{uuid.uuid4().hex[:8]}", tmp_path / "ckpt", []
    for fail_at, offset in ((3, 0.0), (99, 1000.0)):
        mlflow_logger = MLflowLogger(
            mlflow_server.url, experiment_name=exp, spool_dir=tmp_path / "spool",
            backoff=0.01, max_backoff=0.2, flush_seconds=0.05,
        )  # fmt: skip
        saver = CheckpointSaver(folder, filename="ba{batch}.pt", save_interval="4ba")
        trainer = make_trainer(
            6, 1, [saver, FailAt(fail_at, offset)], loggers=[mlflow_logger], load_path=folder,
            log_train_loss=False,
        )  # fmt: skip
        if fail_at < 6:
            with pytest.raises(RuntimeError, match="killed at batch"):
                trainer.fit_sync()
        else:
            trainer.fit_sync()
        ids.append(mlflow_logger.run_id)
    assert ids[0] is not None and ids == [ids[0], ids[0]]
    expected = {s: s * 0.5 for s in range(1, 4)} | {s: s * 0.5 + 1000 for s in range(4, 7)}
    assert history(mlflow_server, ids[0]) == Counter(("half", s, v) for s, v in expected.items())
