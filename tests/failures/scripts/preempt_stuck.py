"""A run for the bounded-SIGTERM tests (tests/failures/test_preemption_stuck.py).

    python preempt_stuck.py WORKDIR [--stuck plain|async|async-sleep|stubborn]
                            [--runner fit_sync|asyncio|trio] [--grace 15]

20 batches of ~20 ms, ``Trainer(preemption=Preemption(grace=...), close_timeout=6)``, a
``CheckpointSaver(WORKDIR/ckpt, save_interval="100ba")`` (never due by itself: only the
preemption's checkpoint), resumed from that folder; a ``JSONLinesLogger`` and two callbacks
that write ``WORKDIR/closed-<name>`` in their ``close`` (one plain, one ``async def``).
``--stuck``: a callback whose ``batch_end`` at batch 5 blocks for 90 s (``time.sleep``,
``await anyio.sleep``, or ``time.sleep`` inside ``async def``; ``stubborn``: the last, and it
ignores the exception that interrupts it) after printing ``stuck``.
``--runner``: ``trainer.fit_sync()``, or ``anyio.run(trainer.fit)`` on asyncio or trio.
stdout ``done`` at the end of an uninterrupted run (weights in WORKDIR/final.pt).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainbus import Callback, Preemption, Trainer
from trainbus.callbacks import CheckpointSaver
from trainbus.loggers import JSONLinesLogger


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, batch: Any) -> torch.Tensor:
        time.sleep(0.02)
        out: torch.Tensor = self.lin(batch[0])
        return out

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(outputs, batch[1])


class Stuck(Callback):
    def __init__(self, how: str) -> None:
        self.how = how

    def batch_end(self, state: Any, logger: Any) -> None:
        if int(state.timer.batch) == 5:
            print("stuck", flush=True)
            time.sleep(90)


class AsyncStuck(Callback):
    def __init__(self, how: str) -> None:
        self.how = how

    async def batch_end(self, state: Any, logger: Any) -> None:
        if int(state.timer.batch) == 5:
            print("stuck", flush=True)
            if self.how == "async":
                await anyio.sleep(90)
            elif self.how == "stubborn":  # blocks the loop and ignores being interrupted
                deadline = time.monotonic() + 90
                while time.monotonic() < deadline:
                    try:
                        time.sleep(deadline - time.monotonic())
                    except Exception as exc:
                        print(f"ignored {type(exc).__name__}", flush=True)
            else:
                time.sleep(90)  # blocks the event loop's thread itself


class Closed(Callback):
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def close(self, state: Any, logger: Any) -> None:
        self.marker.write_text(str(int(state.timer.batch)))


class AsyncClosed(Closed):
    async def close(self, state: Any, logger: Any) -> None:  # type: ignore[override]
        self.marker.write_text(str(int(state.timer.batch)))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument(
        "--stuck", choices=["plain", "async", "async-sleep", "stubborn"], default=None
    )
    parser.add_argument("--runner", choices=["fit_sync", "asyncio", "trio"], default="fit_sync")
    parser.add_argument("--grace", type=float, default=15.0)  # 0: from the environment
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(80, 8, generator=g), torch.randint(0, 4, (80,), generator=g))
    model = Model()
    callbacks: list[Callback] = [
        CheckpointSaver(args.workdir / "ckpt", "ba{batch}.pt", save_interval="100ba"),
        Closed(args.workdir / "closed-plain"), AsyncClosed(args.workdir / "closed-async"),
    ]  # fmt: skip
    if args.stuck == "plain":
        callbacks.append(Stuck(args.stuck))
    elif args.stuck is not None:
        callbacks.append(AsyncStuck(args.stuck))
    trainer = Trainer(
        model, DataLoader(data, batch_size=4, shuffle=True), "1ep",
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        callbacks=callbacks, loggers=[JSONLinesLogger(args.workdir / "m.jsonl")],
        preemption=Preemption(grace=args.grace or None), close_timeout=6, seed=0,
        load_path=args.workdir / "ckpt", device="cpu",
    )  # fmt: skip
    if args.runner == "fit_sync":
        trainer.fit_sync()
    else:
        anyio.run(trainer.fit, backend=args.runner)
        if trainer.preempted:
            sys.exit(143)
    torch.save(model.state_dict(), args.workdir / "final.pt")
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
