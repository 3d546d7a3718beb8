"""One rank of the stop-agreement benchmark (``suite/stop_agreement.py``), under torchrun.

A small DDP model (gloo, CPU) trains ``BATCHES`` batches by hand; after each batch
``StopAgreement.step`` runs as the Trainer's loop runs it (wait for the reduction started at
the boundary before, start this boundary's). Rank 0 prints one JSON line: the median and
the spread of the seconds each ``step`` took on the training thread, and of a whole batch.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

from trainbus.runtime.distributed import DistInfo, StopAgreement


def main(batches: int) -> None:
    dist.init_process_group("gloo")
    info = DistInfo(rank=dist.get_rank(), world_size=dist.get_world_size())
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    agreement = StopAgreement.create(info)
    assert agreement is not None
    steps, whole = [], []
    for _ in range(batches):
        t0 = time.perf_counter()
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        t1 = time.perf_counter()
        agreed = agreement.step([0, 0, 0, 0], last=False)
        t2 = time.perf_counter()
        assert agreed is None
        steps.append(t2 - t1)
        whole.append(t2 - t0)
    agreement.step([1, 0, 0, 0], last=True)  # the last one started: waited, nothing new
    if info.rank == 0:
        print(json.dumps({"step": statistics.median(steps), "batch": statistics.median(whole)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]))
