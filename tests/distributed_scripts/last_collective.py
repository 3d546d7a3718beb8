"""One rank of a run whose last collective ends just before the process exits (issue 16).

Launch it with ``python -m torch.distributed.run --standalone --nproc_per_node=2``
``tests/distributed_scripts/last_collective.py OUT`` (``OUT`` an existing folder;
``--init``: the script initialises the gloo group, as ``fsdp_train.py`` does; otherwise the
Trainer does). Each rank trains one batch, then, as a script that gathers its full model to
save it would, all-gathers a tensor and returns at once.

It sets up the race of pytorch/pytorch#190489 (``trainbus.runtime.gloo_exit`` explains the bug):
the gather's input is a Tensor subclass (as FSDP's ``DTensor`` and the functional
collectives' ``AsyncCollectiveTensor`` are) whose only reference the gloo worker thread
holds (on rank 0: rank 1 joins the gather only after rank 0 dropped it), so that thread's
release of the finished gather takes the GIL; and the main thread keeps the GIL from the
gather to its exit (a switch interval of 1000 s, and a poll that never calls into torch,
whose calls give the GIL up). Whether the release then comes after Python has begun to
finalize depends on what gives the GIL up on the way out; without trainbus's exit handler
about half the launches abort here ("terminate called without an active exception",
``torchrun`` exits non-zero).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainbus import Trainer


class Net(torch.nn.Module):
    """A linear regressor on batches ``(x, y)``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        out: torch.Tensor = self.lin(batch[0])
        return out

    def loss(self, outputs: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.mse_loss(outputs.squeeze(-1), batch[1])


class Shard(torch.Tensor):
    """A Tensor subclass: its Python object outlives Python's references while C++ holds it."""


def gather_and_exit(fifo: Path) -> None:
    """All-gather each rank's id; return with rank 0's gloo worker still to drop the gather.

    Rank 1 joins the gather only once rank 0 has dropped its references to it (``fifo``:
    rank 0 writes a byte, rank 1 waits for it), so on rank 0 the worker thread's release
    of the finished gather is the last one, while the main thread keeps the GIL.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    outputs = [torch.full((4,), -1.0) for _ in range(world)]
    views = [o.numpy() for o in outputs]  # read without calling into torch
    shard = torch.full((4,), float(rank)).as_subclass(Shard)
    sys.setswitchinterval(1000.0)  # from here the main thread keeps the GIL while it runs
    if rank == 1:
        with fifo.open("rb") as f:
            f.read(1)
    work = dist.all_gather(outputs, shard, async_op=True)
    del shard, work  # rank 0: the gloo worker now holds the gather's last references
    if rank == 0:
        with fifo.open("wb") as f:
            f.write(b"1")
    deadline = time.monotonic() + 60.0
    while any(v[0] != r or v[-1] != r for r, v in enumerate(views)):
        if time.monotonic() > deadline:
            raise TimeoutError("the all_gather did not complete in 60 s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--init", action="store_true")
    args = parser.parse_args()
    fifo = args.out / "gathered.fifo"
    if os.environ["RANK"] == "0":
        os.mkfifo(fifo)  # before the rendezvous, so rank 1 finds it
    if args.init:
        dist.init_process_group("gloo")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, generator=g)
    model = Net()
    trainer = Trainer(
        model,
        DataLoader(TensorDataset(x, x.sum(1)), batch_size=1),
        "1ba",
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        device="cpu",
        seed=3,
        dist_timeout=30.0,
    )
    trainer.fit_sync()
    gather_and_exit(fifo)


if __name__ == "__main__":
    main()
