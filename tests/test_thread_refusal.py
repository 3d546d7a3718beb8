"""Every thread trainbus starts, refused by the system in turn (issue 53, item 4).

``threading.Thread.start`` is patched to raise what CPython raises when the operating system
refuses a thread (``RuntimeError("can't start new thread")``) for the threads whose name
starts with the one under test. Each case: a :class:`~trainbus.ThreadStartError` naming the
thread and the limits, raised from the user's call (``Trainer(...)``, ``fit_sync()``,
``engine.run_event``) within the test's timeout (no hang), and no thread left behind.
"""

from __future__ import annotations

import pathlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.helpers import TinyModel, make_loader
from trainbus import Callback, Event, ThreadStartError, Trainer, TrainingPreempted, blocking
from trainbus.bus import LaneThreadError
from trainbus.callbacks import CheckpointSaver

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def refuse(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], list[str]]]:
    """``refuse(prefix)``: from now on, threads named ``prefix...`` are refused; returns the
    names refused so far. After the test: no thread the test started is still alive."""
    before = set(threading.enumerate())
    original = threading.Thread.start
    refused: list[str] = []
    prefixes: list[str] = []

    def start(self: threading.Thread) -> None:
        if any(self.name.startswith(p) for p in prefixes):
            refused.append(self.name)
            raise RuntimeError("can't start new thread")
        original(self)

    def arm(prefix: str) -> list[str]:
        prefixes.append(prefix)
        return refused

    monkeypatch.setattr(threading.Thread, "start", start)
    yield arm
    monkeypatch.setattr(threading.Thread, "start", original)
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    for t in left:  # daemon helpers of other libraries end on their own; ours must not be
        t.join(5)
    assert not [t.name for t in left if t.is_alive()], "threads left running"


def _trainer(*callbacks: Any, **kw: Any) -> Trainer:
    return Trainer(TinyModel(), make_loader(3), "1ep", callbacks=list(callbacks), device="cpu",
                   **kw)  # fmt: skip


def _check(exc: BaseException, name: str) -> None:
    assert isinstance(exc, ThreadStartError), repr(exc)
    assert exc.thread_name.startswith(name)
    text = str(exc)
    assert f"refused to start thread '{exc.thread_name}'" in text, text
    assert "ulimit -u" in text and "can't start new thread" in text, text


class Plain(Callback):
    def batch_end(self, state: Any, logger: Any) -> None:
        return None


def test_the_loop_watch_refused_fails_the_trainer_instead_of_hanging(refuse: Any) -> None:
    """Issue 53: ``Trainer(...)`` never returned. Its INIT session closes under the watch."""
    refuse("trainbus-loop-watch")
    with pytest.raises(ThreadStartError) as caught:
        _trainer(Plain())
    _check(caught.value, "trainbus-loop-watch")
    assert "close deadlines" in str(caught.value)


def test_the_loop_watch_refused_at_the_end_of_fit_closes_everything_first(
    refuse: Any, tmp_path: pathlib.Path
) -> None:
    closed: list[str] = []

    class Closes(Plain):
        def close(self, state: Any, logger: Any) -> None:
            closed.append("closed")

    trainer = _trainer(Closes(), CheckpointSaver(tmp_path, save_interval="1ba"))
    refuse("trainbus-loop-watch")
    with pytest.raises(ThreadStartError) as caught:
        trainer.fit_sync()
    _check(caught.value, "trainbus-loop-watch")
    assert closed == ["closed"] and int(trainer.state.timer.batch) == 3
    assert len(list(tmp_path.iterdir())) == 3  # every checkpoint written, the writer ended


@pytest.mark.parametrize("name", ["trainbus-lane", "trainbus-train"])
def test_a_lane_thread_or_the_training_thread_refused_fails_fit(refuse: Any, name: str) -> None:
    trainer = _trainer(Plain(), Plain())
    refuse(name)
    with pytest.raises(LaneThreadError) as caught:
        trainer.fit_sync()
    _check(caught.value, name)
    assert "lane_threads" in str(caught.value)
    assert int(trainer.state.timer.batch) == 0


def test_the_checkpoint_writer_refused_fails_fit_at_the_first_save(
    refuse: Any, tmp_path: pathlib.Path
) -> None:
    trainer = _trainer(CheckpointSaver(tmp_path, save_interval="1ba"))
    refuse("trainbus-checkpoint-writer")
    with pytest.raises(ThreadStartError) as caught:
        trainer.fit_sync()
    _check(caught.value, "trainbus-checkpoint-writer")
    assert int(trainer.state.timer.batch) == 1 and not list(tmp_path.iterdir())


def test_the_engines_loop_thread_refused_fails_run_event(refuse: Any) -> None:
    trainer = _trainer(Plain())
    refuse("trainbus-engine-loop")
    with pytest.raises(ThreadStartError) as caught:
        trainer.engine.run_event(Event.EPOCH_START)
    _check(caught.value, "trainbus-engine-loop")


def test_an_anyio_worker_refused_fails_fit(refuse: Any) -> None:
    """A ``@blocking`` plain ``close`` of a callback whose lane is on the loop runs in one
    of anyio's worker threads (never on the loop's thread)."""

    class OnLoop(Callback):
        async def batch_end(self, state: Any, logger: Any) -> None:
            return None

        @blocking
        def close(self, state: Any, logger: Any) -> None:
            return None

    trainer = _trainer(OnLoop())
    refuse("AnyIO worker thread")
    with pytest.raises(ThreadStartError) as caught:
        trainer.fit_sync()
    _check(caught.value, "AnyIO worker thread")


def test_the_preemption_watchdog_refused_the_stop_goes_on_and_says_so(
    refuse: Any, tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The watchdog only bounds a stop whose handler is stuck: refused, the preemption
    still stops the run with its checkpoint (exit status 143), and stderr names the
    refusal."""
    holder: list[Trainer] = []

    class Preempt(Callback):
        def batch_end(self, state: Any, logger: Any) -> None:
            if int(state.timer.batch) == 1:
                holder[0].preempt("test")

    trainer = _trainer(Preempt(), CheckpointSaver(tmp_path, save_interval="10ba"))
    holder.append(trainer)
    refuse("trainbus-preemption-")
    with pytest.raises(TrainingPreempted):
        trainer.fit_sync()
    assert [p.name for p in tmp_path.iterdir()]  # the stop's checkpoint
    err = capfd.readouterr().err
    assert "refused to start thread 'trainbus-preemption-watchdog'" in err, err
    refused = trainer._notices.watchdog_refused
    assert refused is not None and "ulimit -u" in str(refused)


@pytest.mark.skipif("wandb" not in sys.modules and not __import__("importlib").util.find_spec(
    "wandb"), reason="wandb is not installed")  # fmt: skip
def test_the_wandb_opener_refused_fails_fit(
    refuse: Any, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainbus.loggers import WandBLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    trainer = _trainer(loggers=[WandBLogger(project="p", dir=tmp_path)])
    refuse("trainbus-wandb-init")
    with pytest.raises(ThreadStartError) as caught:
        trainer.fit_sync()
    _check(caught.value, "trainbus-wandb-init")
