"""D5 snapshot fidelity: late handlers read the state of their own event."""

from __future__ import annotations

from typing import Any

import pytest

from tests.dispatch._probes import E, Progress, batch_of, expected, fit, until
from tests.helpers import make_trainer
from trainbus import Callback, Event, blocking
from trainbus.loggers import InMemoryLogger

pytestmark = pytest.mark.anyio


class Truth(Callback):
    """Lockstep: the live state's per-batch fields at each event."""

    def __init__(self) -> None:
        self.live: Any = None
        self.rows: list[tuple[Any, ...]] = []

    @blocking
    def run_event(self, event: Event, state: Any, logger: Any) -> None:
        live = self.live
        self.rows.append((event, live.timestamp, live.batch, live.outputs, live.loss))


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_d5_late_handlers_read_the_state_of_their_own_event(kind: str) -> None:
    n = 5
    progress, truth, memory = Progress(), Truth(), InMemoryLogger()

    class Reader(Callback):
        """Runs late: its AFTER_DATALOADER waits until the producer ended that batch (as
        far as the live fence lets a handler without @trailing run late, issue 54)."""

        def __init__(self) -> None:
            self.rows: list[tuple[Any, ...]] = []
            self.behind: list[int] = []

        def record(self, event: Event, state: Any, logger: Any) -> None:
            self.rows.append((event, state.timestamp, state.batch, state.outputs, state.loss))
            self.behind.append(int(truth.live.timer.batch) - batch_of(state))
            if event is E.BATCH_END:
                logger.log_metrics({"seen": batch_of(state)})  # default step: its event's

        if kind == "sync":

            def run_event(self, event: Event, state: Any, logger: Any) -> None:
                if event is E.AFTER_DATALOADER:
                    b = batch_of(state)
                    progress.wait(lambda p: p.batches >= b + 1)
                self.record(event, state, logger)

        else:

            async def run_event(self, event: Event, state: Any, logger: Any) -> None:
                if event is E.AFTER_DATALOADER:
                    b = batch_of(state)
                    await until(lambda: progress.batches >= b + 1, "the producer")
                self.record(event, state, logger)

    reader = Reader()
    trainer = make_trainer(
        n,
        callbacks=[progress, truth, reader],
        loggers=[memory],
        max_lag=2,
    )
    truth.live = trainer.state
    await fit(trainer)
    assert max(reader.behind) >= 1  # it really ran while the live state had moved on
    assert len(reader.rows) == len(truth.rows) == len(expected(n))
    for got, want in zip(reader.rows, truth.rows, strict=True):
        assert got[:2] == want[:2]  # event, timestamp
        assert all(g is w for g, w in zip(got[2:], want[2:], strict=True)), got[0]
    seen = memory.get_timeseries("seen")
    assert seen["seen"] == seen["step"] == list(range(1, n + 1))
