"""Embed trainbus in a trio program: training and its watchers in one nursery.

Run it:  python examples/service/trio_embed.py

The run trains an MLP while two tasks follow its EventStream: one prints progress, the
other stops the run when the loss is low enough, by cancelling the scope around
``fit()`` (trio's way; every callback's ``close`` still runs).
"""

from __future__ import annotations

import torch
import trio

import trainbus
from trainbus.callbacks import EventStream, StreamEvent, StreamMetrics


def build_trainer(stream: EventStream, batches: int) -> trainbus.Trainer:
    x = torch.randn(batches * 32, 8)
    y = (x.sum(dim=1) > 0).long()  # learnable: the sign of the sum
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    return trainbus.Trainer(
        model,
        loader,
        "20ep",
        optimizers=torch.optim.Adam(model.parameters(), lr=1e-2),
        loss_fn=torch.nn.functional.cross_entropy,
        loggers=[stream],
    )


async def main(batches: int = 20, target_loss: float = 0.2) -> str:
    stream = EventStream(events=["epoch_end", "fit_end"])
    trainer = build_trainer(stream, batches)
    fit_scope = trio.CancelScope()
    outcome = "finished"
    # Subscribe before training starts, so that no item is published before we listen.
    progress, watch = stream.subscribe(), stream.subscribe()

    async def train() -> None:
        with fit_scope:
            await trainer.fit()

    async def show_progress() -> None:
        async for item in progress:  # ends when the run closes
            if isinstance(item, StreamEvent):
                print(f"{item.event.value}: epoch {int(item.timestamp.epoch)}")

    async def stop_when_good_enough() -> None:
        nonlocal outcome
        async with watch:  # unsubscribes on leaving, even before the run ends
            async for item in watch:
                loss = item.metrics.get("loss/train") if isinstance(item, StreamMetrics) else None
                if loss is not None and loss < target_loss:
                    outcome = f"stopped at batch {item.step}, loss {loss:.3f}"
                    fit_scope.cancel()  # fit() stops within one event, then closes callbacks
                    return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(train)
        nursery.start_soon(show_progress)
        nursery.start_soon(stop_when_good_enough)
    print(outcome)
    return outcome


if __name__ == "__main__":
    trio.run(main)
