"""Every built-in destination on one run receives the same points, in the same order."""

from __future__ import annotations

import io
import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers import make_trainer
from trainbus import Callback
from trainbus.loggers import ConsoleLogger, InMemoryLogger, JSONLinesLogger, TensorBoardLogger

Point = tuple[str, int]


class LogsEveryBatch(Callback):
    """Two more metrics per batch, logged from a handler (so after ``loss/train``)."""

    def batch_end(self, state: Any, logger: Any) -> None:
        batch = int(state.timer.batch)
        logger.log_metrics({"cb/a": float(batch), "cb/b": 2.0 * batch})


def by_name(points: list[Point]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for name, step in points:
        out.setdefault(name, []).append(step)
    return out


def console_points(text: str) -> list[Point]:
    points = []
    for line in text.splitlines():
        m = re.fullmatch(r"\[epoch \d+ batch (\d+)\] (.*)", line)
        assert m, line
        points += [(pair.split("=")[0], int(m.group(1))) for pair in m.group(2).split(" ")]
    return points


@pytest.mark.anyio
async def test_all_destinations_receive_the_same_points_before_fit_returns(
    tmp_path: Path,
) -> None:
    threads_before = set(threading.enumerate())
    stream = io.StringIO()
    memory = InMemoryLogger()
    loggers = [
        ConsoleLogger("1ba", stream=stream),
        JSONLinesLogger(tmp_path / "m.jsonl"),
        TensorBoardLogger(tmp_path / "tb"),
        memory,
    ]
    await make_trainer(3, 2, [LogsEveryBatch()], eval_batches=2, loggers=loggers).fit()

    with (tmp_path / "m.jsonl").open(encoding="utf-8") as f:
        jsonl = [(p["name"], p["step"]) for p in map(json.loads, f)]
    expected: list[Point] = []
    for batch in range(1, 7):
        expected += [("loss/train", batch), ("cb/a", batch), ("cb/b", batch)]
        if batch % 3 == 0:
            expected.append(("eval/loss", batch))
    assert jsonl == expected  # the whole sequence, in logged order
    assert console_points(stream.getvalue()) == expected

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tensorboard = {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert tensorboard == by_name(expected)  # per name: TensorBoard keeps one series each
    assert memory.steps == by_name(expected)
    # The event file writer's thread was joined at close (the async backends' own idle
    # worker threads may stay: they are theirs, not ours).
    extra = set(threading.enumerate()) - threads_before
    assert [t for t in extra if not t.name.startswith(("Trio thread", "AnyIO worker"))] == []
