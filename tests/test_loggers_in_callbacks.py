"""A ``LoggerDestination`` passed in ``callbacks=`` is a destination (as a Lightning user,
who puts loggers beside callbacks, expects): it receives what it would in ``loggers=``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import EventLog, make_trainer
from trainbus import Event, LoggerDestination
from trainbus.core.logger import LogRecord
from trainbus.loggers import InMemoryLogger, JSONLinesLogger


def metrics_of(where: str, make: Any, tmp_path: Path) -> tuple[dict[str, list[int]], Any]:
    """The (name -> steps) a fresh destination received with it passed ``where``."""
    dest = make(tmp_path)
    kw: dict[str, Any] = {"callbacks": [dest]} if where == "callbacks" else {"loggers": [dest]}
    make_trainer(3, epochs=2, eval_batches=2, seed=0, **kw).fit_sync()
    if isinstance(dest, InMemoryLogger):
        return dest.steps, dest
    steps: dict[str, list[int]] = {}
    for line in Path(dest.path).read_text().splitlines():
        row = json.loads(line)
        steps.setdefault(row["name"], []).append(row["step"])
    return steps, dest


MAKERS = {
    "in_memory": lambda tmp: InMemoryLogger(),
    "jsonl": lambda tmp: JSONLinesLogger(tmp / f"m{len(list(tmp.iterdir()))}.jsonl"),
}


@pytest.mark.parametrize("kind", MAKERS)
def test_a_destination_in_callbacks_receives_every_metric_it_would_in_loggers(
    kind: str, tmp_path: Path
) -> None:
    as_logger, _ = metrics_of("loggers", MAKERS[kind], tmp_path)
    as_callback, _ = metrics_of("callbacks", MAKERS[kind], tmp_path)
    assert as_logger["loss/train"] == [1, 2, 3, 4, 5, 6]
    assert as_logger["eval/loss"] == [3, 6]
    assert as_callback == as_logger


def test_a_destination_in_both_lists_is_registered_once(tmp_path: Path) -> None:
    mem = InMemoryLogger()
    log = EventLog()
    make_trainer(2, callbacks=[log, mem], loggers=[mem]).fit_sync()
    assert mem.steps["loss/train"] == [1, 2]  # once each, not twice
    assert log.closed == 1


class CountingDestination(LoggerDestination):
    def __init__(self) -> None:
        self.records = 0
        self.fit_starts = 0

    def fit_start(self, state: Any, logger: Any) -> None:
        self.fit_starts += 1

    def log_record(self, record: LogRecord) -> None:
        self.records += 1


def test_a_custom_destination_in_callbacks_sees_its_events_once_and_every_record() -> None:
    dest = CountingDestination()
    trainer = make_trainer(2, callbacks=[dest])
    trainer.fit_sync()
    assert dest.fit_starts == 1
    assert dest.records == 2  # loss/train at each batch
    assert dest in trainer.logger.destinations


def test_the_same_destination_twice_in_callbacks_is_still_refused() -> None:
    mem = InMemoryLogger()
    with pytest.raises(ValueError, match=r"callbacks\[1\] is the same InMemoryLogger"):
        make_trainer(2, callbacks=[mem, mem])


def test_plain_callbacks_keep_their_order_before_destinations() -> None:
    log, mem = EventLog(), InMemoryLogger()
    trainer = make_trainer(2, callbacks=[mem, log])
    assert trainer.state.callbacks == [log, mem]
    trainer.fit_sync()
    assert (Event.FIT_END, 2) in log.events
