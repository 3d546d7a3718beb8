"""A run that a preemption notice reaches in a chosen phase (``tests/test_preemption_phases.py``).

    python preempt_phases.py OUT --phase PHASE [--rank R] [--load PATH]
    python -m torch.distributed.run --standalone --nproc_per_node=2 preempt_phases.py OUT ...

16 samples of batch 1, 32 batches (``2ep`` in one process, ``4ep`` of 8 a rank under torchrun),
batches of about 20 ms; a ``CheckpointSaver(OUT/ckpt, "ba{batch}.pt", save_interval="10ba")``
and a rank-zero ``JSONLinesLogger(OUT/m.jsonl)``; ``Trainer(preemption=True)``, whose grace
comes from ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``. On rank ``R`` (default 0) the run holds in
``PHASE`` until this rank has its notice, after writing ``OUT/phase-rank<R>`` (its pid):

- ``fit_start``: a ``@blocking`` ``fit_start`` (no batch trained yet);
- ``batch``: the model's forward of the first batch;
- ``eval``: the model's forward of the first evaluation batch (evaluation after batch 2);
- ``checkpoint``: the saver's writer thread, while it writes ``ba10.pt`` (a listener);
- ``close``: a plain ``close`` (every batch trained), on every rank;
- ``stuck``: a plain ``batch_end`` at batch 3 that sleeps for an hour, whatever comes.

Every rank writes ``OUT/exit-rank<r>`` (the status its ``fit_sync()`` raised, or 0) and
``OUT/done-rank<r>`` (the batch it stopped at); ``--linger R``: rank R then waits 30 s
before it ends (torchrun's ``SIGTERM`` to the workers left finds it there). ``--phase none``
trains to the end (``--load``: resumed from that checkpoint or folder).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import trainbus
from trainbus import Callback, State, Trainer
from trainbus.callbacks import CheckpointSaver
from trainbus.loggers import JSONLinesLogger

NOTICED = threading.Event()  # this rank has its preemption notice


class Net(torch.nn.Module):
    """A linear regressor whose forward can hold (``batch``, ``eval``) until the notice."""

    def __init__(self, hold: str | None, cue: Path) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 1)
        self.hold, self.cue = hold, cue

    def forward(self, batch: Any) -> torch.Tensor:
        phase = "batch" if self.training else "eval"
        if self.hold == phase:
            self.hold = None
            reached(self.cue)
        time.sleep(0.02)
        out: torch.Tensor = self.lin(batch[0]).squeeze(-1)
        return out

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return F.mse_loss(outputs, batch[1])


def reached(cue: Path) -> None:
    """The phase is reached: say so (the pid, for a signal to this rank), hold until notice."""
    cue.write_text(str(os.getpid()))
    NOTICED.wait(60)


class Noticed(Callback):
    async def preemption_notice(self, state: State, logger: trainbus.Logger) -> None:
        NOTICED.set()


class HoldAtStart(Callback):
    def __init__(self, cue: Path) -> None:
        self.cue = cue

    @trainbus.blocking
    def fit_start(self, state: State, logger: trainbus.Logger) -> None:
        reached(self.cue)


class HoldInClose(Callback):
    def __init__(self, cue: Path) -> None:
        self.cue = cue

    def close(self, state: State, logger: trainbus.Logger) -> None:
        reached(self.cue)


class Stuck(Callback):
    def __init__(self, cue: Path) -> None:
        self.cue = cue

    def batch_end(self, state: State, logger: trainbus.Logger) -> None:
        if int(state.timer.batch) == 3:
            self.cue.write_text(str(os.getpid()))
            time.sleep(3600)


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(16, generator=g)
    return TensorDataset(x, y)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    phases = ["none", "fit_start", "batch", "eval", "checkpoint", "close", "stuck"]
    parser.add_argument("--phase", choices=phases, default="none")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--load", default=None)
    parser.add_argument("--linger", type=int, default=-1)  # this rank ends 30 s late
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    # close: every rank holds (one that ended before the notice was not preempted)
    here = args.phase if rank == args.rank or args.phase == "close" else "none"
    cue = out / f"phase-rank{rank}"
    (out / f"pid-rank{rank}").write_text(str(os.getpid()))
    saver = CheckpointSaver(out / "ckpt", "ba{batch}.pt", save_interval="10ba")
    callbacks: list[Callback] = [saver, Noticed()]
    if here == "fit_start":
        callbacks.append(HoldAtStart(cue))
    if here == "close":
        callbacks.append(HoldInClose(cue))
    if here == "stuck":
        callbacks.append(Stuck(cue))
    if here == "checkpoint":

        def listener(timestamp: Any, path: Path) -> None:
            if path.name == "ba10.pt":
                reached(cue)

        saver.add_listener(listener)
    model = Net(here if here in ("batch", "eval") else None, cue)
    dataset = data()
    trainer = Trainer(
        model, DataLoader(dataset, batch_size=1, shuffle=True),
        "4ep" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "2ep",
        eval_dataloader=DataLoader(dataset, batch_size=4), eval_interval="2ba",
        optimizers=torch.optim.SGD(model.parameters(), lr=0.05), callbacks=callbacks,
        loggers=[JSONLinesLogger(out / "m.jsonl")], device="cpu", seed=7,
        load_path=args.load, preemption=True, dist_timeout=60.0,
    )  # fmt: skip
    status: Any = 0
    try:
        trainer.fit_sync()
    except SystemExit as exc:  # TrainingPreempted: its status, before the process ends
        status = exc.code
        raise
    finally:
        (out / f"done-rank{rank}").write_text(str(int(trainer.state.timestamp.batch)))
        (out / f"exit-rank{rank}").write_text(str(status))
        if rank == args.linger:  # still running when torchrun ends the workers left
            time.sleep(30)


if __name__ == "__main__":
    main()
