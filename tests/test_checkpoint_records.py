"""A checkpoint's destination state includes every record logged before it (issue 41).

The saver captures callback state once every handler of the batches before it has run and
every record logged so far has reached every destination (``docs/crash-consistency.md``,
"No window after a checkpoint"). A destination that takes its time with each record (a
plain ``log_record`` on its own thread) still has, in the ``state_dict`` the checkpoint
stores, the records logged up to the checkpointed batch: the trainer's loss and a plain
handler's metric, logged on another thread.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch

from tests.helpers import make_trainer
from trainbus import Callback, LoggerDestination
from trainbus.callbacks import CheckpointSaver


class SlowToTake(LoggerDestination):
    """Keeps ``(name, step)`` of each record; each takes a while (a wait no one ends)."""

    trailing = 2  # the barrier need not wait for it: only the checkpoint's drain does

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self._never = threading.Event()

    def log_record(self, record: Any) -> None:
        self._never.wait(0.05)  # slower than the batch: records queue up behind it
        self.seen.extend((name, record.step) for name in record.metrics)

    def state_dict(self) -> dict[str, Any]:
        return {"seen": list(self.seen)}


class Logs(Callback):
    def batch_end(self, state: Any, logger: Any) -> None:  # on its own thread
        logger.log_metrics({"plain": 1.0})


def test_every_record_logged_before_a_checkpoint_is_in_it(tmp_path: Path) -> None:
    dest = SlowToTake()
    saver = CheckpointSaver(tmp_path, filename="ba{batch}.pt", save_interval="2ba")
    make_trainer(6, 1, [Logs(), saver], loggers=[dest]).fit_sync()
    for batch in (2, 4, 6):
        ckpt = torch.load(tmp_path / f"ba{batch}.pt", weights_only=False)
        (state,) = [v for k, v in ckpt["callbacks"].items() if "SlowToTake" in k]
        seen = {(name, step) for name, step in state["seen"]}
        assert {("loss/train", batch), ("plain", batch)} <= seen, (batch, sorted(seen))
        assert {s for _, s in seen} == set(range(1, batch + 1)), batch
