"""SpeedMonitor: windowed throughput from the training thread's clock, eval left out."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.helpers import make_trainer
from trainbus.callbacks import SpeedMonitor
from trainbus.core.callback import resolve_callback
from trainbus.loggers import InMemoryLogger


class ScriptedClock:
    """Returns the given times in order, recording the thread of each call."""

    def __init__(self, times: list[float]) -> None:
        self._times: Iterator[float] = iter(times)
        self.threads: list[int] = []

    def __call__(self) -> float:
        self.threads.append(threading.get_ident())
        return next(self._times)  # StopIteration: the monitor read the clock more often


def run(
    monitor: SpeedMonitor, n_batches: int, epochs: int = 1, **kw: object
) -> tuple[InMemoryLogger, object]:
    logs = InMemoryLogger()
    trainer = make_trainer(n_batches, epochs, [monitor], loggers=[logs], **kw)
    trainer.fit_sync()
    return logs, trainer


def series(logs: InMemoryLogger, name: str) -> list[float]:
    return [round(v, 6) for v in logs.get_timeseries(name)[name]]


def test_window_arithmetic_with_a_scripted_clock() -> None:
    monitor = SpeedMonitor(window_size=2)
    monitor._clock = ScriptedClock([10.0, 11.0, 13.0, 16.0, 20.0])  # type: ignore[method-assign]
    logs, _ = run(monitor, 4)  # 4 samples per batch
    # b1: 4 sp over 1 s; b2: 8 sp over 3 s (window holds fit start + 2 batches);
    # b3: batches 2-3, 8 sp over 5 s; b4: batches 3-4, 8 sp over 7 s.
    assert series(logs, "throughput/samples_per_sec") == [4.0, 2.666667, 1.6, 1.142857]
    assert series(logs, "throughput/batches_per_sec") == [1.0, 0.666667, 0.4, 0.285714]
    assert series(logs, "wall_clock/train") == [1.0, 3.0, 6.0, 10.0]
    assert logs.get_timeseries("wall_clock/train")["step"] == [1, 2, 3, 4]


def test_evaluation_time_is_left_out_of_throughput_but_not_wall_clock() -> None:
    monitor = SpeedMonitor(window_size=10)
    # fit_start, b1, b2, eval_start, eval_end (100 s of eval), b3, b4, eval_start, eval_end
    monitor._clock = ScriptedClock([0.0, 1.0, 2.0, 2.0, 102.0, 103.0, 104.0, 104.0, 204.0])  # type: ignore[method-assign]
    logs, _ = run(monitor, 4, eval_interval="2ba", eval_batches=1)
    assert series(logs, "throughput/samples_per_sec") == [4.0, 4.0, 4.0, 4.0]
    assert series(logs, "wall_clock/train") == [1.0, 2.0, 103.0, 104.0]


def test_clock_is_read_on_the_training_thread_at_each_event() -> None:
    monitor = SpeedMonitor()
    clock = ScriptedClock([float(i) for i in range(100)])
    monitor._clock = clock  # type: ignore[method-assign]
    _, trainer = run(monitor, 3, eval_batches=1)
    model = trainer.state.model  # type: ignore[attr-defined]
    assert len(clock.threads) == 1 + 3 + 2  # fit_start, three batch ends, one eval pass
    assert set(clock.threads) == model.forward_threads  # the thread that ran forward()


def test_handlers_are_blocking_and_plain_so_no_thread_or_loop_hop() -> None:
    table = resolve_callback(SpeedMonitor())
    assert {e.value for e in table.handlers} == {"fit_start", "eval_start", "eval_end", "batch_end"}
    assert all(h.is_blocking and not h.is_async for h in table.handlers.values())
    assert not table.has_sync  # no lane thread is started for it


def test_real_clock_values_are_consistent() -> None:
    logs, _ = run(SpeedMonitor(window_size=3), 6, epochs=2)
    samples = logs.get_timeseries("throughput/samples_per_sec")["throughput/samples_per_sec"]
    batches = logs.get_timeseries("throughput/batches_per_sec")["throughput/batches_per_sec"]
    walls = logs.get_timeseries("wall_clock/train")["wall_clock/train"]
    assert len(samples) == len(batches) == len(walls) == 12
    assert all(s / b == pytest.approx(4.0) for s, b in zip(samples, batches, strict=True))
    assert all(b > 0 for b in batches)
    assert walls == sorted(walls)
    assert walls[0] > 0


def test_a_continued_fit_restarts_the_wall_clock_and_window() -> None:
    monitor = SpeedMonitor()
    monitor._clock = ScriptedClock([0.0, 1.0, 2.0, 50.0, 52.0, 54.0])  # type: ignore[method-assign]
    logs = InMemoryLogger()
    trainer = make_trainer(2, 1, [monitor], loggers=[logs])
    trainer.fit_sync()
    trainer.fit_sync(duration="2ba")
    assert series(logs, "wall_clock/train") == [1.0, 2.0, 2.0, 4.0]
    assert series(logs, "throughput/batches_per_sec") == [1.0, 1.0, 0.5, 0.5]


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "100"])
def test_window_size_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(ValueError, match=r"SpeedMonitor\(window_size=.*\) must be an int >= 1"):
        SpeedMonitor(window_size=bad)  # type: ignore[arg-type]
