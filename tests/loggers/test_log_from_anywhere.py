"""``logger.log_metrics`` from any thread or task (issue 45, item 6).

Eight plain threads and eight tasks on the event loop log 10,000 points each, outside any
handler, while a fit runs; one ``JSONLinesLogger`` and one ``HTTPMetricsUploader`` (against
a real server on 127.0.0.1) receive every point once, none torn, each caller's in order.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

from tests.helpers import make_trainer
from tests.loggers.test_http_uploader import MetricsServer, servers  # noqa: F401
from trainbus import Callback, blocking
from trainbus.loggers import HTTPMetricsUploader, JSONLinesLogger

pytestmark = pytest.mark.anyio

THREADS = 8
TASKS = 8
POINTS = 10_000
WATCHDOG = 120.0


class HoldTraining(Callback):
    """Holds the training thread at the first batch's end until the loggers are done."""

    def __init__(self) -> None:
        self.training = threading.Event()
        self.logged = threading.Event()

    @blocking
    def batch_end(self, state: Any, logger: Any) -> None:
        if not self.training.is_set():
            self.training.set()
            assert self.logged.wait(WATCHDOG), "the logging threads and tasks did not finish"


def _names() -> list[str]:
    return [f"thread{i}" for i in range(THREADS)] + [f"task{i}" for i in range(TASKS)]


def _check_order(points: list[tuple[str, int, Any]]) -> None:
    """Each caller's points arrive in the order it logged them, value == step, once each."""
    seen: dict[str, list[int]] = defaultdict(list)
    for name, step, value in points:
        assert value == step, (name, step, value)
        seen[name].append(step)
    assert sorted(seen) == sorted(_names())
    for name, steps in seen.items():
        assert steps == list(range(POINTS)), f"{name}: out of order or not once each"


async def test_8_threads_and_8_tasks_log_10000_points_each_into_jsonl_and_http(
    anyio_backend: str, tmp_path: Path, servers: Callable[..., MetricsServer]  # noqa: F811
) -> None:
    server = servers()
    path = tmp_path / "m.jsonl"
    hold = HoldTraining()
    uploader = HTTPMetricsUploader(server.url, batch_size=1000, flush_seconds=0.05,
                                   backoff=0.001, max_backoff=0.01)
    trainer = make_trainer(
        2, callbacks=[hold], loggers=[JSONLinesLogger(path), uploader],
        wait_warning_seconds=math.inf,
    )
    logger = trainer.logger
    remaining = THREADS + TASKS
    lock = threading.Lock()

    def finished_one() -> None:
        nonlocal remaining
        with lock:
            remaining -= 1
            if remaining == 0:
                hold.logged.set()

    def in_thread(name: str) -> None:
        assert hold.training.wait(WATCHDOG)
        for k in range(POINTS):
            logger.log_metrics({name: k}, step=k)
        finished_one()

    async def in_task(name: str) -> None:
        await anyio.to_thread.run_sync(hold.training.wait, WATCHDOG)
        for k in range(POINTS):
            logger.log_metrics({name: k}, step=k)
            if k % 100 == 99:
                await anyio.sleep(0)
        finished_one()

    threads = [threading.Thread(target=in_thread, args=(f"thread{i}",)) for i in range(THREADS)]
    for t in threads:
        t.start()
    try:
        async with anyio.create_task_group() as tg:
            for i in range(TASKS):
                tg.start_soon(in_task, f"task{i}")
            await trainer.fit()
    finally:
        hold.logged.set()
        hold.training.set()
        for t in threads:
            t.join()

    names = set(_names())
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]  # every line parses: none torn
    ours = [(r["name"], r["step"], r["value"]) for r in rows if r["name"] in names]
    assert len(ours) == (THREADS + TASKS) * POINTS
    _check_order(ours)

    sent = [
        (p["name"], p["step"], p["value"])
        for body in server.accepted.values()
        for p in body["points"]
        if p["name"] in names
    ]
    counts = Counter((name, step) for name, step, _ in sent)
    assert len(counts) == (THREADS + TASKS) * POINTS
    assert set(counts.values()) == {1}
    assert all(value == step for _, step, value in sent)
    assert not server.conflicts


class ClosingJSONLines(JSONLinesLogger):
    """A JSON-lines logger whose ``close`` lets another thread log while it runs."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.closing = threading.Event()
        self.logged = threading.Event()

    def close(self, state: Any, logger: Any) -> None:
        self.closing.set()
        assert self.logged.wait(WATCHDOG)
        super().close(state, logger)


async def test_a_point_logged_while_destinations_close_waits_for_the_next_fit(
    anyio_backend: str, tmp_path: Path
) -> None:
    # On main the point reached the closed logger after its close, which reopened the
    # file and left it open (unflushed) after fit() returned.
    path = tmp_path / "m.jsonl"
    dest = ClosingJSONLines(path)
    trainer = make_trainer(2, loggers=[dest])
    logger = trainer.logger

    def late() -> None:
        assert dest.closing.wait(WATCHDOG)
        logger.log_metrics({"late": 1.0}, step=99)
        dest.logged.set()

    thread = threading.Thread(target=late)
    thread.start()
    try:
        await trainer.fit()
    finally:
        dest.logged.set()
        thread.join()
    assert dest._file is None, "a record reached the logger after its close"
    names = [json.loads(line)["name"] for line in path.read_text().splitlines()]
    assert "late" not in names
    dest.closing.clear()
    dest.logged.set()
    await trainer.fit(duration="1ep")  # the backlog is delivered at the next fit's start
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["name"], r["step"]) for r in rows if r["name"] == "late"] == [("late", 99)]


def test_step_outside_a_handler_is_the_batch_count_read_at_the_call(tmp_path: Path) -> None:
    steps: list[int] = []
    trainer: Any = None

    class FromAThread(Callback):
        @blocking
        def batch_end(self, state: Any, logger: Any) -> None:
            box: list[int] = []
            def log() -> None:
                box.append(int(trainer.state.timer.batch))
                trainer.logger.log_metrics({"outside": 1.0})

            thread = threading.Thread(target=log)
            thread.start()
            thread.join()
            steps.extend(box)

    from trainbus.loggers import InMemoryLogger

    memory = InMemoryLogger()
    trainer = make_trainer(3, callbacks=[FromAThread()], loggers=[memory])
    trainer.logger.log_metrics({"before": 1.0})  # before any fit: the backlog, step 0
    trainer.fit_sync()
    trainer.logger.log_metrics({"after": 1.0})  # waits for a next fit
    assert memory.get_timeseries("outside")["step"] == steps == [1, 2, 3]
    assert memory.get_timeseries("before")["step"] == [0]
    assert "after" not in memory.data


async def test_a_thread_logging_across_a_fits_start_keeps_its_order(
    anyio_backend: str, tmp_path: Path
) -> None:
    # Records logged before the fit wait in the backlog; the backlog is handed over before
    # any record logged after the bus took over, so the caller's order holds across it.
    path = tmp_path / "m.jsonl"
    hold = HoldTraining()
    trainer = make_trainer(2, callbacks=[hold], loggers=[JSONLinesLogger(path)],
                           wait_warning_seconds=math.inf)
    logger = trainer.logger
    started = threading.Event()

    def across() -> None:
        for k in range(POINTS):
            logger.log_metrics({"across": k}, step=k)
            if k == 100:
                started.set()  # the fit starts while this thread goes on logging
        hold.logged.set()

    thread = threading.Thread(target=across)
    thread.start()
    try:
        await anyio.to_thread.run_sync(started.wait, WATCHDOG)
        await trainer.fit()
    finally:
        hold.logged.set()
        thread.join()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in rows if r["name"] == "across"] == list(range(POINTS))


class LogsInTheWorker(torch.utils.data.Dataset[Any]):
    """A dataset whose items log from the DataLoader worker process that loads them."""

    def __init__(self, logger: Any) -> None:
        self.logger = logger

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Any:
        self.logger.log_metrics({"loaded": float(i)})
        return torch.zeros(4), 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="DataLoader workers are forked on POSIX")
def test_logging_in_a_forked_dataloader_worker_is_an_error_that_names_the_fix() -> None:
    # The worker's logger is a copy: on main its records vanished without a word.
    trainer = make_trainer(2)
    dataset = LogsInTheWorker(trainer.logger)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=2, num_workers=1, multiprocessing_context="fork"
    )
    with pytest.raises(RuntimeError, match=r"forked child process .* log them from a handler"):
        next(iter(loader))
    trainer.logger.log_metrics({"here": 1.0})  # the training process itself is fine
