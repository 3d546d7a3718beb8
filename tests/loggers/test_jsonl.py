"""JSONLinesLogger: every point, in order, on disk when fit() returns, also after failures."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import make_trainer
from trainbus import Callback, LogLevel, LogRecord, TrainbusWarning
from trainbus.loggers import InMemoryLogger, JSONLinesLogger
from trainbus.loggers.jsonl import to_json_value


def read(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def metric(lines: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["name"] == name]


@pytest.mark.anyio
async def test_every_loss_point_is_on_disk_in_order_when_fit_returns(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "a" / "m.jsonl"  # parent folders do not exist yet
    memory = InMemoryLogger()
    # flush_seconds=inf: nothing is flushed while training, so the content below is
    # complete only because close() flushed (and fsync-ed) before fit() returned.
    trainer = make_trainer(4, 2, loggers=[JSONLinesLogger(path, flush_seconds=math.inf), memory])
    await trainer.fit()
    lines = read(path)
    loss = metric(lines, "loss/train")
    assert [p["step"] for p in loss] == list(range(1, 9))
    assert [p["value"] for p in loss] == [v for _, _, v in memory.data["loss/train"]]
    assert all(set(p) == {"name", "value", "step", "wall_time", "level", "kind"} for p in lines)
    assert {(p["level"], p["kind"]) for p in loss} == {("batch", "metric")}
    walls = [p["wall_time"] for p in loss]
    assert walls == sorted(walls)
    assert all(isinstance(w, float) for w in walls)


class FailsAtBatch(Callback):
    def __init__(self, batch: int) -> None:
        self.batch = batch

    def batch_end(self, state: Any, logger: Any) -> None:
        if int(state.timer.batch) == self.batch:
            logger.log_metrics({"marker": 1.0})
            raise RuntimeError("callback failed")


def test_a_failure_mid_run_loses_no_logged_point(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    trainer = make_trainer(
        10, 1, [FailsAtBatch(3)], loggers=[JSONLinesLogger(path, flush_seconds=math.inf)]
    )
    with pytest.raises(RuntimeError, match="callback failed"):
        trainer.fit_sync()
    lines = read(path)
    assert [p["step"] for p in metric(lines, "loss/train")] == [1, 2, 3]
    assert [(p["step"], p["value"]) for p in metric(lines, "marker")] == [(3, 1.0)]


class LogsOddValues(Callback):
    def fit_start(self, state: Any, logger: Any) -> None:
        logger.log_hyperparameters({"lr": 0.1, "layers": [4, 3], "name": "tiny"})

    def batch_end(self, state: Any, logger: Any) -> None:
        logger.log_metrics(
            {
                "nan": float("nan"),
                "inf": float("inf"),
                "ninf": -float("inf"),
                "scalar": torch.tensor(2.5),
                "one": torch.tensor([0.5]),
                "vec": torch.tensor([1.0, float("nan"), 3.0]),
                "int": 7,
                "text": "ok",
            },
            step=42,
            level="epoch",
        )


def test_values_and_hyperparameters_as_written(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    make_trainer(1, 1, [LogsOddValues()], loggers=[JSONLinesLogger(path)]).fit_sync()
    text = path.read_text(encoding="utf-8")
    assert "NaN," not in text  # strict JSON: no bare NaN/Infinity tokens
    lines = read(path)
    hparams = {p["name"]: p for p in lines if p["kind"] == "hyperparameter"}
    assert {k: p["value"] for k, p in hparams.items()} == {
        "lr": 0.1,
        "layers": [4, 3],
        "name": "tiny",
    }
    assert {p["level"] for p in hparams.values()} == {"fit"}
    values = {p["name"]: p["value"] for p in lines if p["step"] == 42}
    assert values == {
        "nan": "NaN",
        "inf": "Infinity",
        "ninf": "-Infinity",
        "scalar": 2.5,
        "one": 0.5,
        "vec": [1.0, "NaN", 3.0],
        "int": 7,
        "text": "ok",
    }
    assert math.isnan(float(values["nan"]))
    assert float(values["ninf"]) == -math.inf
    assert {p["level"] for p in lines if p["step"] == 42} == {"epoch"}


def test_a_continued_fit_appends(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    trainer = make_trainer(2, 1, loggers=[JSONLinesLogger(path)])
    trainer.fit_sync()
    trainer.fit_sync(duration="1ep")
    assert [p["step"] for p in metric(read(path), "loss/train")] == [1, 2, 3, 4]


class HParamsAtInit(Callback):
    def init(self, state: Any, logger: Any) -> None:
        logger.log_hyperparameters({"seed": 0})


def test_points_logged_at_init_reach_the_file(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    make_trainer(1, 1, [HParamsAtInit()], loggers=[JSONLinesLogger(path)]).fit_sync()
    lines = read(path)
    assert (lines[0]["name"], lines[0]["kind"]) == ("seed", "hyperparameter")


def _record(step: int) -> LogRecord:
    return LogRecord({"x": float(step)}, step=step, wall_time=time.time(), level=LogLevel.BATCH)


def test_flush_interval_zero_flushes_every_record(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    dest = JSONLinesLogger(path, flush_seconds=0)
    dest.log_record(_record(1))
    assert [p["step"] for p in read(path)] == [1]  # readable by another process now
    dest.log_record(_record(2))
    assert [p["step"] for p in read(path)] == [1, 2]
    dest.close(None, None)  # type: ignore[arg-type]


def test_buffered_until_the_interval_or_close(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    dest = JSONLinesLogger(path, flush_seconds=math.inf)
    dest.log_record(_record(1))
    assert path.read_text(encoding="utf-8") == ""
    dest.close(None, None)  # type: ignore[arg-type]
    assert [p["step"] for p in read(path)] == [1]
    dest.close(None, None)  # type: ignore[arg-type]  # closing twice is harmless


@pytest.mark.parametrize("bad", [-1, "1s", float("nan"), True])
def test_bad_flush_interval(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(ValueError, match="flush_seconds"):
        JSONLinesLogger(tmp_path / "m.jsonl", flush_seconds=bad)


def test_bad_path() -> None:
    with pytest.raises(TypeError, match="path=123"):
        JSONLinesLogger(123)  # type: ignore[arg-type]


def test_to_json_value_of_containers() -> None:
    assert to_json_value({"a": (1, float("inf")), 2: None}) == {"a": [1, "Infinity"], "2": None}
    assert to_json_value(Path("x/y")) == "x/y"

    class Opaque:
        def __str__(self) -> str:
            return "opaque"

    assert to_json_value(Opaque()) == "opaque"


# -- a torn last line (issue 12.6) ---------------------------------------------------------


@pytest.mark.parametrize("ends_with_newline_before", [True, False])
def test_a_torn_last_line_is_moved_aside_before_appending(
    tmp_path: Path, ends_with_newline_before: bool
) -> None:
    path = tmp_path / "m.jsonl"
    make_trainer(2, loggers=[JSONLinesLogger(path)]).fit_sync()
    complete = path.read_bytes()
    fragment = b'{"name":"loss/train","value":0.5,"step":3,"wall_time":1.0,"level":"batch",'
    if not ends_with_newline_before:  # the whole file is one torn line
        complete = b""
        path.write_bytes(fragment)
    else:
        path.write_bytes(complete + fragment)  # a full disk stopped the last write here

    with pytest.warns(TrainbusWarning, match=r"m\.jsonl.*torn.*m\.jsonl\.torn"):
        make_trainer(2, loggers=[JSONLinesLogger(path)]).fit_sync()

    lines = read(path)  # every line parses: nothing glued onto the fragment
    assert path.read_bytes().startswith(complete)
    assert len(metric(lines, "loss/train")) == (4 if complete else 2)
    torn = path.with_name("m.jsonl.torn")
    assert torn.read_bytes() == fragment + b"\n"


def test_torn_fragments_accumulate_and_intact_files_are_untouched(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"a":1}\n{"b"')
    with pytest.warns(TrainbusWarning, match="torn"):
        make_trainer(1, loggers=[JSONLinesLogger(path)]).fit_sync()
    with path.open("ab") as f:
        f.write(b'{"c":')
    with pytest.warns(TrainbusWarning, match="torn"):
        make_trainer(1, loggers=[JSONLinesLogger(path)]).fit_sync()
    assert path.with_name("m.jsonl.torn").read_bytes() == b'{"b"\n{"c":\n'
    before = path.read_bytes()
    make_trainer(1, loggers=[JSONLinesLogger(path)]).fit_sync()  # no warning: intact
    assert path.read_bytes().startswith(before)
    assert len(read(path)) == 1 + 3


# -- planted symbolic links (issue 46) -----------------------------------------------------


def test_a_torn_file_that_is_a_symlink_is_refused_and_its_target_not_appended_to(
    tmp_path: Path,
) -> None:
    """Regression: the torn fragment was appended through a ``<file>.torn`` symlink."""
    path = tmp_path / "run" / "m.jsonl"
    path.parent.mkdir()
    path.write_bytes(b'{"a":1}\n{"b"')  # a torn last line: the logger moves it aside
    target = tmp_path / "elsewhere.txt"
    target.write_bytes(b"the user's file\n")
    path.with_name("m.jsonl.torn").symlink_to(target)
    with pytest.raises(OSError, match=r"m\.jsonl\.torn' is a symbolic link"):
        make_trainer(1, loggers=[JSONLinesLogger(path)]).fit_sync()
    assert target.read_bytes() == b"the user's file\n"  # nothing appended through the link
    assert path.read_bytes() == b'{"a":1}\n{"b"'  # not cut either: the fragment is not lost


@pytest.mark.parametrize("torn", [False, True])
def test_a_log_file_that_is_a_symlink_is_refused_and_its_target_untouched(
    tmp_path: Path, torn: bool
) -> None:
    """Regression: the file was cut back to its last newline, then appended to, through a
    symlink planted under its name."""
    target = tmp_path / "elsewhere.txt"
    target.write_bytes(b"line one\nline two, no newline" if torn else b"line one\n")
    before = target.read_bytes()
    path = tmp_path / "run" / "m.jsonl"
    path.parent.mkdir()
    path.symlink_to(target)
    with pytest.raises(OSError, match=r"m\.jsonl' is a symbolic link"):
        make_trainer(1, loggers=[JSONLinesLogger(path)]).fit_sync()
    assert target.read_bytes() == before
    assert not path.with_name("m.jsonl.torn").exists()


def test_a_resumed_logger_skips_the_points_written_after_its_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"

    def record(step: int) -> LogRecord:
        return LogRecord({"loss": step * 0.5}, step, 1.0)

    killed = JSONLinesLogger(path)
    killed.log_record(record(1))
    checkpoint = killed.state_dict()
    killed.log_record(record(2))
    killed.log_record(record(3))
    killed.close(None, None)  # type: ignore[arg-type]

    resumed = JSONLinesLogger(path)
    resumed.load_state_dict(checkpoint)
    resumed.log_record(record(2))  # replayed: skipped
    second = resumed.state_dict()
    assert second["pending"] == [["loss", 3]]  # not replayed yet: carried to the next one
    resumed.close(None, None)  # type: ignore[arg-type]

    again = JSONLinesLogger(path)
    again.load_state_dict(second)
    again.log_record(record(3))
    again.log_record(record(4))
    again.close(None, None)  # type: ignore[arg-type]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3, 4]


def test_a_checkpoint_of_another_file_changes_nothing(tmp_path: Path) -> None:
    log = JSONLinesLogger(tmp_path / "m.jsonl")
    other = str(tmp_path / "other.jsonl")
    log.load_state_dict({"path": other, "position": 0, "pending": [["a", 1]]})
    log.log_record(LogRecord({"a": 1.0}, 1, 1.0))
    log.close(None, None)  # type: ignore[arg-type]
    assert len((tmp_path / "m.jsonl").read_text().splitlines()) == 1
