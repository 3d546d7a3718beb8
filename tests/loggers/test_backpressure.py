"""Backpressure policies of a destination (docs/loggers.md, "Falling behind").

A destination is held in its first record (an event it waits for) while a ``@blocking``
handler logs more: what reaches it, what is counted and what is warned follow from the
policy and the limit, never from time.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import anyio
import pytest

from tests.helpers import make_trainer
from trainbus import Backpressure, Callback, LoggerDestination, RecordsDroppedWarning, blocking
from trainbus.loggers import HTTPMetricsUploader, InMemoryLogger, JSONLinesLogger

WATCHDOG = 30.0


class Held(LoggerDestination):
    """Keeps every record it receives (but the trainer's loss); waits in the one named
    ``first`` until ``release``."""

    def __init__(self, policy: Backpressure | None) -> None:
        self.backpressure = policy
        self.entered = threading.Event()
        self.release = threading.Event()
        self.got: list[tuple[int, dict[str, Any]]] = []
        self.closed_after = -1

    def log_record(self, record: Any) -> None:
        if "first" in record.metrics:
            self.entered.set()
            assert self.release.wait(WATCHDOG)
        if "loss/train" not in record.metrics:
            self.got.append((record.step, dict(record.metrics)))

    def close(self, state: Any, logger: Any) -> None:
        self.closed_after = len(self.got)


class HeldAsync(Held):
    """The same on the event loop (an ``async def`` destination: a loop lane)."""

    async def log_record(self, record: Any) -> None:  # type: ignore[override]
        if "first" in record.metrics:
            self.entered.set()
            assert await anyio.to_thread.run_sync(self.release.wait, WATCHDOG)
        if "loss/train" not in record.metrics:
            self.got.append((record.step, dict(record.metrics)))


class LogWhileHeld(Callback):
    """At the first batch's end: log one record, wait until the destination holds it, log
    ``more`` (a list of ``(step, metrics)``), release it, then log ``after``."""

    def __init__(self, dest: Held, more: list[tuple[int, dict[str, Any]]],
                 after: list[tuple[int, dict[str, Any]]] = ()) -> None:  # type: ignore[assignment]
        self.dest, self.more, self.after = dest, more, list(after)

    @blocking
    def batch_end(self, state: Any, logger: Any) -> None:
        if int(state.timer.batch) != 1:
            return
        logger.log_metrics({"first": 0.0}, step=0)
        assert self.dest.entered.wait(WATCHDOG)
        for step, metrics in self.more:
            logger.log_metrics(metrics, step=step)
        self.dest.release.set()
        for step, metrics in self.after:
            logger.log_metrics(metrics, step=step)


def _fit(dest: Held, more: list[tuple[int, dict[str, Any]]], **kw: Any) -> Any:
    trainer = make_trainer(1, callbacks=[LogWhileHeld(dest, more, **kw)], loggers=[dest])
    trainer.fit_sync()
    return trainer


def _dropping(policy: str) -> Any:
    return pytest.warns(RecordsDroppedWarning, match=policy)


DESTS = pytest.mark.parametrize("make", [Held, HeldAsync], ids=["plain", "async"])


@DESTS
def test_drop_oldest_keeps_the_newest_records_within_the_limit(make: type[Held]) -> None:
    dest = make(Backpressure.drop_oldest(queue_size=3))  # one being received, two waiting
    with _dropping("drop_oldest") as caught:
        trainer = _fit(dest, [(k, {"a": float(k)}) for k in range(1, 11)])
    assert [step for step, _ in dest.got] == [0, 9, 10]
    assert dest.closed_after == 3  # close after every record that was not dropped
    stats = trainer.engine.statistics().callbacks[-1]
    assert (stats.records_dropped, stats.values_dropped, stats.records_coalesced) == (8, 8, 0)
    assert stats.peak_pending_records <= 3
    assert len(caught) == 1
    assert "dropped 8 of 12 records" in str(caught[0].message)  # the loss's record too
    assert "a 8" in str(caught[0].message)  # the names that lost the most values


@DESTS
def test_latest_keeps_the_latest_value_of_each_name(make: type[Held]) -> None:
    dest = make(Backpressure.latest(queue_size=3))
    more = [(1, {"once": 1.0})] + [(k, {"a": float(k)}) for k in range(2, 11)]
    with _dropping("latest"):
        trainer = _fit(dest, more)
    # drop_oldest would have lost "once"; latest drops only older values of "a"
    assert dest.got == [(0, {"first": 0.0}), (1, {"once": 1.0}), (10, {"a": 10.0})]
    stats = trainer.engine.statistics().callbacks[-1]
    assert (stats.records_dropped, stats.values_dropped) == (8, 8)


def test_latest_drops_the_oldest_when_no_waiting_record_is_superseded() -> None:
    dest = Held(Backpressure.latest(queue_size=3))  # one being received, two waiting
    more = [(1, {"a": 1.0, "b": 1.0}), (2, {"c": 2.0}), (3, {"a": 3.0}), (4, {"c": 4.0})]
    with _dropping("latest"):
        _fit(dest, more)
    # (3, a) supersedes no waiting record ((1) has b too): the oldest, (1), is dropped;
    # (4, c) supersedes (2, c)
    assert dest.got == [(0, {"first": 0.0}), (3, {"a": 3.0}), (4, {"c": 4.0})]


@DESTS
def test_coalesce_merges_records_of_one_step_and_loses_no_other_step(
    make: type[Held],
) -> None:
    dest = make(Backpressure.coalesce(queue_size=3))
    more = [(5, {f"m{k}": float(k)}) for k in range(10)] + [(5, {"m9": 99.0})]
    with _dropping("coalesce") as caught:
        trainer = _fit(dest, more, after=[(6, {"next": 6.0}), (7, {"next": 7.0})])
    assert dest.got[0] == (0, {"first": 0.0})
    assert dest.got[1] == (5, {"m0": 0.0})
    merged = {f"m{k}": float(k) for k in range(1, 9)} | {"m9": 99.0}  # the newer m9 wins
    assert dest.got[2] == (5, merged)
    assert dest.got[3:] == [(6, {"next": 6.0}), (7, {"next": 7.0})]  # other steps wait
    stats = trainer.engine.statistics().callbacks[-1]
    assert (stats.records_dropped, stats.records_coalesced, stats.values_dropped) == (0, 9, 1)
    assert "merged 9" in str(caught[0].message)


@DESTS
def test_block_with_a_limit_loses_nothing_and_warns_nothing(make: type[Held]) -> None:
    dest = make(Backpressure.block(queue_size=2))
    dest.release.set()  # a held destination would hold the training thread too (D12)
    trainer = _fit(dest, [(k, {"a": float(k)}) for k in range(1, 50)])
    assert [step for step, _ in dest.got] == list(range(50))
    stats = trainer.engine.statistics().callbacks[-1]
    assert stats.records_dropped == stats.values_dropped == 0
    assert stats.peak_pending_records <= 2


def test_a_lossy_destination_keeps_up_and_warns_nothing() -> None:
    memory = InMemoryLogger()
    memory.backpressure = Backpressure.drop_oldest(queue_size=8)
    trainer = make_trainer(4, loggers=[memory])
    trainer.fit_sync()
    assert memory.get_timeseries("loss/train")["step"] == [1, 2, 3, 4]
    assert trainer.engine.statistics().callbacks[-1].records_dropped == 0


def test_a_lossy_policy_on_the_uploader_is_refused_when_the_trainer_is_built() -> None:
    uploader = HTTPMetricsUploader("http://127.0.0.1:9/metrics")
    uploader.backpressure = Backpressure.latest(queue_size=10)
    with pytest.raises(ValueError, match=r"HTTPMetricsUploader takes only Backpressure\.block"):
        make_trainer(1, loggers=[uploader])
    uploader.backpressure = Backpressure.block(queue_size=10)
    make_trainer(1, loggers=[uploader])  # block is fine


def test_a_backpressure_that_is_not_a_policy_is_refused() -> None:
    lines = JSONLinesLogger("unused.jsonl")
    lines.backpressure = "drop_oldest"  # type: ignore[assignment]
    with pytest.raises(TypeError, match=r"is not a trainbus\.Backpressure"):
        make_trainer(1, loggers=[lines])


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: Backpressure.drop_oldest(1), r"queue_size must be an int >= 2"),
        (lambda: Backpressure.latest(0), r"queue_size must be an int >= 2"),
        (lambda: Backpressure.coalesce(2.5), r"queue_size must be an int >= 2"),  # type: ignore[arg-type]
        (lambda: Backpressure.block(0), r"queue_size must be an int >= 1"),
        (lambda: Backpressure("newest", 4), r"is not a policy"),  # type: ignore[arg-type]
    ],
)
def test_bad_policies_name_the_fix(build: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build()


def test_repr_reads_as_the_call_that_builds_it() -> None:
    assert repr(Backpressure()) == "Backpressure.block()"
    assert repr(Backpressure.latest(64)) == "Backpressure.latest(queue_size=64)"


class Keep(LoggerDestination):
    """Keeps ``(name, step)`` of every value it receives."""

    def __init__(self, policy: Backpressure) -> None:
        self.backpressure = policy
        self.got: list[tuple[str, int]] = []

    def log_record(self, record: Any) -> None:
        self.got.extend((name, record.step) for name in record.metrics)


class KeepAsync(Keep):
    async def log_record(self, record: Any) -> None:  # type: ignore[override]
        self.got.extend((name, record.step) for name in record.metrics)
        await anyio.sleep(0)


@pytest.mark.parametrize("make", [Keep, KeepAsync], ids=["plain", "async"])
@pytest.mark.parametrize("policy", ["drop_oldest", "latest"])
def test_threads_logging_into_a_lossy_destination_lose_only_what_is_counted(
    make: type[Keep], policy: str
) -> None:
    threads, points = 8, 2_000
    dest = make(getattr(Backpressure, policy)(queue_size=4))

    class FromThreads(Callback):
        @blocking
        def batch_end(self, state: Any, logger: Any) -> None:
            def log(i: int) -> None:
                for k in range(points):
                    logger.log_metrics({f"t{i}": float(k)}, step=k)

            workers = [threading.Thread(target=log, args=(i,)) for i in range(threads)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()

    trainer = make_trainer(1, callbacks=[FromThreads()], loggers=[dest])
    with warnings.catch_warnings(record=True) as caught:  # how far it falls behind varies
        warnings.simplefilter("always")
        trainer.fit_sync()
    stats = trainer.engine.statistics().callbacks[-1]
    dropped = [w for w in caught if issubclass(w.category, RecordsDroppedWarning)]
    assert len(dropped) == (1 if stats.records_dropped else 0)
    assert not [w for w in caught if w not in dropped]
    ours = [(name, step) for name, step in dest.got if name.startswith("t")]
    # one value per record, the trainer's loss/train record too
    assert len(dest.got) + stats.records_dropped == threads * points + 1
    assert stats.values_dropped == stats.records_dropped
    for i in range(threads):
        steps = [step for name, step in ours if name == f"t{i}"]
        assert steps == sorted(set(steps)), "a caller's records out of order or twice"
    assert stats.pending_records == 0


@pytest.mark.anyio
async def test_records_logged_without_pause_do_not_starve_the_destinations_events(
    anyio_backend: str,
) -> None:
    # The destination logs a record into itself for each one it receives: its mailbox is
    # never empty when its runner looks. A marker delivers at most `limit` records, then
    # goes to the back of the lane's queue, so its batch_end (and the BATCH_END barrier)
    # still comes; without that, the first barrier waited for ever.
    seen: list[int] = []
    echo = threading.Event()
    echo.set()

    class Echo(Keep):
        def log_record(self, record: Any) -> None:
            super().log_record(record)
            if echo.is_set():
                trainer.logger.log_metrics({"echo": 1.0}, step=record.step + 1)

        def batch_end(self, state: Any, logger: Any) -> None:
            seen.append(int(state.timer.batch))

    dest = Echo(Backpressure.drop_oldest(queue_size=4))
    trainer = make_trainer(5, loggers=[dest], close_timeout=5.0)
    with anyio.fail_after(WATCHDOG), warnings.catch_warnings():
        warnings.simplefilter("ignore", RecordsDroppedWarning)
        await trainer.fit()
    echo.clear()
    assert seen == [1, 2, 3, 4, 5]
