"""A training run for the checkpoint file tests (tests/failures/test_checkpoint_files.py).

    python checkpoint_run.py WORKDIR [--batches 6] [--every 2] [--keep -1] [--load PATH]
                             [--die-in-write N] [--width 64]

Trains a linear layer (``--width`` squared weights) for ``--batches`` batches with a
``CheckpointSaver(WORKDIR/ckpt, "ba{batch}.pt", save_interval=f"{every}ba")``, resuming from
``--load`` (a file, the folder, or an ``s3://`` URL) when given. stdout: ``resumed <batch>``
once the trainer is built, ``done`` at the end (the weights are then in WORKDIR/final.pt).
``--die-in-write N``: the Nth ``torch.save`` writes half of its archive, prints
``HALF-WRITTEN`` and waits to be killed. Warnings go to stderr (``-W always``).
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from trainbus import Trainer
from trainbus.callbacks import CheckpointSaver


def _dying_save(n: int) -> None:
    real_save, calls = torch.save, []

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) == n:
            buf = io.BytesIO()
            real_save(obj, buf, *args, **kwargs)
            data = buf.getvalue()
            f.write(data[: len(data) // 2])
            f.flush()
            print("HALF-WRITTEN", flush=True)
            time.sleep(600)
        real_save(obj, f, *args, **kwargs)

    torch.save = save


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--keep", type=int, default=-1)
    parser.add_argument("--load", default=None)
    parser.add_argument("--die-in-write", type=int, default=0)
    parser.add_argument("--width", type=int, default=64)
    args = parser.parse_args(argv)
    if args.die_in_write:
        _dying_save(args.die_in_write)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batches * 4, args.width, generator=g)
    y = torch.randint(0, args.width, (args.batches * 4,), generator=g)
    model = torch.nn.Linear(args.width, args.width)
    saver = CheckpointSaver(
        args.workdir / "ckpt", "ba{batch}.pt", save_interval=f"{args.every}ba",
        num_checkpoints_to_keep=args.keep, overwrite=True,
    )  # fmt: skip
    trainer = Trainer(
        model, DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True), "1ep",
        loss_fn=torch.nn.functional.cross_entropy,
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        callbacks=[saver], device="cpu", seed=0, load_path=args.load,
    )  # fmt: skip
    print(f"resumed {int(trainer.state.timer.batch)}", flush=True)
    trainer.fit_sync()
    torch.save(model.state_dict(), args.workdir / "final.pt")
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
