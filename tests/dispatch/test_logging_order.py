"""Log records reach destinations in order, also those logged from ``close``."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.dispatch._probes import batch_of, fit
from tests.helpers import make_trainer
from trainbus import Callback, LoggerDestination
from trainbus.loggers import InMemoryLogger

pytestmark = pytest.mark.anyio


async def test_log_records_reach_destinations_in_order_also_from_close() -> None:
    n = 4

    class Logs(Callback):
        def __init__(self) -> None:
            self.k = 0

        def after_forward(self, state: Any, logger: Any) -> None:  # plain: inline or thread
            logger.log_metrics({"fwd": self.k})
            self.k += 1

        async def batch_end(self, state: Any, logger: Any) -> None:
            await anyio.sleep(0)
            logger.log_metrics({"end": batch_of(state)})

        def close(self, state: Any, logger: Any) -> None:
            logger.log_metrics({"closed": 1})

    class AsyncDest(LoggerDestination):
        def __init__(self) -> None:
            self.got: list[tuple[str, Any, int]] = []
            self.at_close: list[str] = []

        async def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
            await anyio.sleep(0)
            self.got += [(name, value, step) for name, value in metrics.items()]

        async def close(self, state: Any, logger: Any) -> None:
            self.at_close = [name for name, _, _ in self.got]

    adest, memory = AsyncDest(), InMemoryLogger()
    trainer = make_trainer(
        n, callbacks=[Logs()], loggers=[adest, memory]
    )
    await fit(trainer)

    def series(name: str) -> tuple[list[Any], list[int]]:
        rows = [(v, s) for m, v, s in adest.got if m == name]
        return [v for v, _ in rows], [s for _, s in rows]

    assert series("fwd") == (list(range(n)), list(range(n)))
    assert series("end") == (list(range(1, n + 1)), list(range(1, n + 1)))
    assert series("loss/train")[1] == list(range(1, n + 1))
    assert "closed" in adest.at_close  # logged in a callback's close, before loggers close
    for name in ("fwd", "end", "closed"):
        ts = memory.get_timeseries(name)
        assert (ts[name], ts["step"]) == series(name)
