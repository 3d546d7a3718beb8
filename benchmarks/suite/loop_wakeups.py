"""The event loop's wake-ups a batch under a loop of your own (``trainbus.Bus``, issue 47):
``bus.statistics().loop_wakeups`` of a fit of B2 batches minus one of B1, over B2 - B1.

Three loops, as the README's "Your own PyTorch loop" writes them: ``with bus.batch(...)``
and ``AFTER_TRAIN_BATCH`` with the README's ``@trailing(2) async def batch_end`` upload
(awaiting nothing: the count is the bus's rule, not the upload's time); the same loop with
10 callbacks each with an ``async def`` on every event it publishes; and a loop that
publishes nothing but ``BATCH_END``, with the upload. The rule (``producer.WAKES_LOOP``):
at most two a batch, at its first publish that queues work for the loop and at its end,
whatever the loop publishes. A count, not a time: it does not move with the machine.
"""

from __future__ import annotations

from typing import Any

from harness import stats
from harness.runner import Context

FIGURE = "loop wake-ups a batch under your own loop (`trainbus.Bus`)"
TARGET = 2.0
LOOPS = {
    "upload": "`bus.batch()` + `AFTER_TRAIN_BATCH`, a trailing upload",
    "everywhere": "the same, 10 callbacks with an `async def` on each event",
    "batch_end": "`BATCH_END` only, a trailing upload",
}


def measure(batches: list[int]) -> dict[str, float]:
    import torch

    import trainbus
    from trainbus import Event

    class Upload(trainbus.Callback):
        @trainbus.trailing(2)
        async def batch_end(self, state: Any, logger: Any) -> None:
            pass

    class Everywhere(trainbus.Callback):
        async def after_dataloader(self, state: Any, logger: Any) -> None: ...
        async def batch_start(self, state: Any, logger: Any) -> None: ...
        async def before_train_batch(self, state: Any, logger: Any) -> None: ...
        async def after_train_batch(self, state: Any, logger: Any) -> None: ...
        async def batch_end(self, state: Any, logger: Any) -> None: ...
        async def batch_checkpoint(self, state: Any, logger: Any) -> None: ...

    def wakeups(loop: str, n: int) -> int:
        callbacks = [Everywhere() for _ in range(10)] if loop == "everywhere" else [Upload()]
        bus = trainbus.Bus(callbacks=callbacks, warn_slow_callbacks=False)
        x = torch.zeros(8, 4)

        def train() -> None:
            with bus.epoch():
                for _ in range(n):
                    if loop == "batch_end":
                        bus.advance_batch(samples=8)
                        bus.publish(Event.BATCH_END)
                        continue
                    with bus.batch(x):
                        bus.publish(Event.AFTER_TRAIN_BATCH)

        bus.run_sync(train)
        return bus.statistics().loop_wakeups

    b1, b2 = batches
    return {loop: (wakeups(loop, b2) - wakeups(loop, b1)) / (b2 - b1) for loop in LOOPS}


def run(ctx: Context) -> list[dict[str, Any]]:
    batches = [5, 15] if ctx.quick else [20, 120]
    per_batch = ctx.child("loop_wakeups", batches=batches)
    cells = [f"{LOOPS[loop]}: {value:.2f}" for loop, value in per_batch.items()]
    worst = max(per_batch.values())
    return [stats.row(FIGURE, f"<= {TARGET:.0f} a batch, whatever the loop publishes",
                      "trainbus " + "; ".join(cells),
                      stats.MET if worst <= TARGET else stats.MISSED,
                      short=f"{worst:.2f} a batch at most", unit="count", batches=batches,
                      **per_batch)]
