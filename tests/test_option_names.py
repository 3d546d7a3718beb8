"""One naming rule for options (CONTRIBUTING.md, "Naming options"): every old name still
works, warns once per process with a DeprecationWarning naming the new one, and refuses to
be given together with the new one."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import trainbus
from tests.helpers import make_trainer
from trainbus import Backpressure, Engine, Logger, State
from trainbus.core import renamed


@pytest.fixture(autouse=True)
def fresh_warnings() -> Iterator[None]:
    renamed._WARNED.clear()  # each test sees the first use of a name
    yield
    renamed._WARNED.clear()


def engine(**kw: Any) -> Engine:
    import torch

    state = State(model=torch.nn.Linear(1, 1), max_duration="1ep")
    return Engine(state, Logger(state), [], **kw)


def _tensorboard(**kw: Any) -> Any:
    pytest.importorskip("tensorboard")
    from trainbus.loggers import TensorBoardLogger

    return TensorBoardLogger("unused-dir", **kw)


def _jsonl(**kw: Any) -> Any:
    from trainbus.loggers import JSONLinesLogger

    return JSONLinesLogger("unused.jsonl", **kw)


def _mlflow(**kw: Any) -> Any:
    pytest.importorskip("httpx")
    from trainbus.loggers import MLflowLogger

    return MLflowLogger("http://127.0.0.1:1", **kw)


def _http(**kw: Any) -> Any:
    pytest.importorskip("httpx")
    from trainbus.loggers import HTTPMetricsUploader

    return HTTPMetricsUploader("http://127.0.0.1:1/points", **kw)


def _dashboard(**kw: Any) -> Any:
    pytest.importorskip("starlette")
    from trainbus.callbacks import Dashboard

    return Dashboard(**kw)


def _watch(**kw: Any) -> Any:
    from trainbus.callbacks import EventStream

    stream = EventStream()
    stream.watch(make_trainer(1, loggers=[stream]).engine, **kw)
    return stream


def _create_app(**kw: Any) -> Any:
    pytest.importorskip("starlette")
    from trainbus.serve import create_app

    return create_app(**kw).state.jobs


def _job_manager(**kw: Any) -> Any:
    pytest.importorskip("starlette")
    from trainbus.serve import JobManager, demo_job_factory

    return JobManager(demo_job_factory, **kw)


#: (where, old, new, value, build(**kw), read(built) -> the value the option took)
RENAMED: list[tuple[str, str, str, Any, Callable[..., Any], Callable[[Any], Any]]] = [
    ("Trainer", "wait_warning", "wait_warning_seconds", 5.0,
     lambda **kw: make_trainer(1, **kw), lambda t: t.engine.options.wait_warning),
    ("Engine", "warn_slow", "warn_slow_callbacks", False,
     engine, lambda e: e.options.warn_slow),
    ("Engine", "wait_warning", "wait_warning_seconds", 5.0,
     engine, lambda e: e.options.wait_warning),
    ("Bus", "warn_slow", "warn_slow_callbacks", False,
     trainbus.Bus, lambda b: b.engine.options.warn_slow),
    ("Bus", "wait_warning", "wait_warning_seconds", 5.0,
     trainbus.Bus, lambda b: b.engine.options.wait_warning),
    ("JSONLinesLogger", "flush_interval", "flush_seconds", 0.0, _jsonl,
     lambda d: d.flush_seconds),
    ("TensorBoardLogger", "flush_secs", "flush_seconds", 5.0, _tensorboard,
     lambda d: d.flush_seconds),
    ("MLflowLogger", "flush_interval", "flush_seconds", 5.0, _mlflow,
     lambda d: d.flush_interval),
    ("HTTPMetricsUploader", "flush_interval", "flush_seconds", 5.0, _http,
     lambda d: d.flush_interval),
    ("Dashboard", "interval", "snapshot_seconds", 2.0, _dashboard,
     lambda d: d.snapshot_seconds),
    ("EventStream.watch", "interval", "snapshot_seconds", 2.0, _watch,
     lambda s: s._feed_interval),
    ("create_app", "stream_buffer", "buffer_size", 16, _create_app, lambda j: j.buffer_size),
    ("JobManager", "stream_buffer", "buffer_size", 16, _job_manager, lambda j: j.buffer_size),
    ("Backpressure.latest", "limit", "queue_size", 8, Backpressure.latest,
     lambda b: b.queue_size),
    ("Backpressure.drop_oldest", "limit", "queue_size", 8, Backpressure.drop_oldest,
     lambda b: b.queue_size),
    ("Backpressure.coalesce", "limit", "queue_size", 8, Backpressure.coalesce,
     lambda b: b.queue_size),
    ("Backpressure.block", "limit", "queue_size", 8, Backpressure.block,
     lambda b: b.queue_size),
]  # fmt: skip
IDS = [f"{where}({old}=)" for where, old, *_ in RENAMED]


@pytest.mark.parametrize(("where", "old", "new", "value", "build", "read"), RENAMED, ids=IDS)
def test_the_old_name_warns_once_naming_the_new_one_and_still_works(
    where: str, old: str, new: str, value: Any, build: Callable[..., Any],
    read: Callable[[Any], Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    message = rf"{where}\({old}=\.\.\.\) is deprecated: the option is now {new}="
    with pytest.warns(DeprecationWarning, match=message) as record:
        built = build(**{old: value})
    assert read(built) == value  # the old name still sets the option
    assert len(record) == 1
    package = str(Path(trainbus.__file__).parent)
    assert not record[0].filename.startswith(package), record[0].filename  # the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = build(**{old: value})  # once per process: no second warning
    assert read(again) == value
    assert read(build(**{new: value})) == value  # the new name, silently


@pytest.mark.parametrize(("where", "old", "new", "value", "build", "read"), RENAMED, ids=IDS)
def test_old_and_new_name_together_are_refused(
    where: str, old: str, new: str, value: Any, build: Callable[..., Any],
    read: Callable[[Any], Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match=rf"both {old}= and {new}=.*pass {new}= only"):
        build(**{old: value, new: value})


def test_preempt_takes_seconds_from_now_as_timeout() -> None:
    import time

    trainer = make_trainer(1)
    before = time.monotonic()
    assert trainer.preempt("maintenance", timeout=60)
    deadline = trainer.state.preemption.deadline  # type: ignore[union-attr]
    assert before + 60 <= deadline <= time.monotonic() + 60
    with pytest.raises(TypeError, match="both deadline= and timeout="):
        make_trainer(1).preempt("x", deadline=time.monotonic(), timeout=1)
    with pytest.raises(ValueError, match=r"timeout=-1 must be seconds from now >= 0"):
        make_trainer(1).preempt("x", timeout=-1)
