"""Issue 12, observation 3: ``close()`` raising ``SystemExit`` or ``KeyboardInterrupt``.

A plain or async ``close`` that raises a ``BaseException`` gets D10's guarantees: every
other callback's ``close``, every destination's ``close`` and every ``post_close`` (its
own included) still run, the JSON-lines file and the uploader have every logged point,
then ``fit()`` raises that exception itself (not a group, and never a hang).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.failures._harness import (
    CloseOrder,
    Probe,
    SmallServer,
    closing,
    jsonl_points,
    run_bounded,
    server_fixture,
    spooled_points,
    trainbus_threads,
)
from tests.helpers import TinyModel, make_loader
from trainbus import Callback, LoggerDestination, Trainer
from trainbus.loggers import HTTPMetricsUploader, JSONLinesLogger

BACKENDS = ["asyncio", "trio"]
OTHERS = ["PlainCloser", "AsyncCloser", "RecordingDestination"]


@pytest.fixture
def server() -> Iterator[SmallServer]:
    yield from server_fixture()


class RecordingDestination(LoggerDestination):
    def __init__(self, order: CloseOrder) -> None:
        self.order = order

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        pass

    def close(self, state: Any, logger: Any) -> None:
        self.order.add("close", "RecordingDestination")

    def post_close(self) -> None:
        self.order.add("post_close", "RecordingDestination")


class RaisingClose(Callback):
    def __init__(self, error: BaseException, order: CloseOrder) -> None:
        self.error, self.order = error, order

    def close(self, state: Any, logger: Any) -> None:
        self.order.add("close", "RaisingClose")
        raise self.error

    def post_close(self) -> None:
        self.order.add("post_close", "RaisingClose")


class RaisingAsyncClose(Callback):
    def __init__(self, error: BaseException, order: CloseOrder) -> None:
        self.error, self.order = error, order

    async def close(self, state: Any, logger: Any) -> None:
        self.order.add("close", "RaisingAsyncClose")
        raise self.error

    async def post_close(self) -> None:
        self.order.add("post_close", "RaisingAsyncClose")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("error_type", [SystemExit, KeyboardInterrupt])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_close_raising_a_base_exception_closes_everything_else_then_raises_it(
    kind: str,
    error_type: type[BaseException],
    backend: str,
    tmp_path: Path,
    server: SmallServer,
) -> None:
    order = CloseOrder()
    error = error_type(3) if error_type is SystemExit else error_type()
    raising = (RaisingClose if kind == "sync" else RaisingAsyncClose)(error, order)
    probe = Probe()
    jsonl, spool = tmp_path / "metrics.jsonl", tmp_path / "spool"

    async def scenario() -> None:
        trainer = Trainer(
            TinyModel(),
            make_loader(5),
            "1ep",
            callbacks=[
                closing("sync", "PlainCloser", order)(),
                raising,
                closing("async", "AsyncCloser", order)(),
                probe,
            ],
            loggers=[
                RecordingDestination(order),
                JSONLinesLogger(jsonl, flush_seconds=60.0),  # written out only by close
                HTTPMetricsUploader(
                    server.url, spool_dir=spool, flush_seconds=60.0, backoff=0.01,
                    close_timeout=5.0,
                ),
            ],
            close_timeout=5,
        )
        await trainer.fit()

    outcome = run_bounded(scenario, backend)

    assert outcome.error is error, repr(outcome.error)  # itself, not wrapped in a group
    order.assert_complete([*OTHERS, type(raising).__name__])
    assert probe.logged == [1, 2, 3, 4, 5]
    assert Counter(jsonl_points(jsonl)) == Counter(probe.logged)
    assert Counter(server.points()) + Counter(spooled_points(spool)) >= Counter(probe.logged)
    assert not trainbus_threads()
