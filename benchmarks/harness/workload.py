"""Workloads and the plain loop every framework is measured against (stdlib + torch only).

Workloads (one torch thread, batches generated with a fixed seed and kept in memory, SGD
lr 0.01, cross-entropy):

- ``tiny``: Linear 32->64, ReLU, Linear 64->4, batch 16: the instruction counts, where the
  model's own work should be small beside the framework's;
- ``mlp``: Linear 256->512, ReLU, Linear 512->10, batch 64 (about 0.5 ms a batch here);
- ``g10``: Linear 512->2112, ReLU, Linear 2112->10, batch 128: about 10 ms of CPU a batch
  on this machine when it is quiet (scenario (g) of SPEC section 7; the row prints it).

The plain loop calls its callbacks' hooks directly at the 12 per-batch points of
Composer's loop (``PER_BATCH_POINTS``): the floor of dispatch.
"""

from __future__ import annotations

import itertools
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

SEED = 0
#: name -> (layer widths, batch size)
WORKLOADS: dict[str, tuple[tuple[int, ...], int]] = {
    "tiny": ((32, 64, 4), 16),
    "mlp": ((256, 512, 10), 64),
    "g10": ((512, 2112, 10), 128),
}

PER_BATCH_POINTS = (
    "after_dataloader", "batch_start", "before_train_batch", "before_forward",
    "after_forward", "before_loss", "after_loss", "before_backward",
    "after_backward", "after_train_batch", "batch_end", "batch_checkpoint",
)


@dataclass
class Workload:
    name: str
    model: nn.Module
    batches: list[tuple[torch.Tensor, torch.Tensor]]

    loss_fn = staticmethod(F.cross_entropy)

    def optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.model.parameters(), lr=0.01)


def make_workload(name: str, n_batches: int) -> Workload:
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    dims, batch_size = WORKLOADS[name]
    layers: list[nn.Module] = []
    for fan_in, fan_out in itertools.pairwise(dims):
        if layers:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(fan_in, fan_out))
    gen = torch.Generator().manual_seed(SEED)
    batches = [
        (torch.randn(batch_size, dims[0], generator=gen),
         torch.randint(0, dims[-1], (batch_size,), generator=gen))
        for _ in range(n_batches)
    ]
    return Workload(name, nn.Sequential(*layers), batches)


def noop(*args: Any, **kwargs: Any) -> None:
    return None


def sleep_5ms(*args: Any, **kwargs: Any) -> None:
    time.sleep(0.005)


def post_metrics(url: str, step: int, loss: float) -> None:
    """POST one point in trainbus's wire format and wait for the answer (urllib)."""
    point = {"name": "loss", "value": loss, "step": step, "wall_time": time.time()}
    body = json.dumps({"run": "bench", "points": [point]}).encode()
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


class TimedBatches:
    """The batches as a re-iterable that notes when the first one is fetched."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.batches = batches
        self.t_first: float | None = None

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i, batch in enumerate(self.batches):
            if i == 0 and self.t_first is None:
                self.t_first = time.perf_counter()
            yield batch


def plain_fit(w: Workload, data: Any, opt: torch.optim.Optimizer,
              hooks: dict[str, list[Callable[[Any], None]]] | None = None) -> None:
    """One epoch of a hand-written loop; ``hooks`` maps PER_BATCH_POINTS to functions."""
    model, loss_fn = w.model, w.loss_fn
    if not hooks:
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        return
    state = SimpleNamespace(step=0, loss=None)
    h = [hooks.get(point, []) for point in PER_BATCH_POINTS]

    def fire(i: int) -> None:
        for fn in h[i]:
            fn(state)

    for x, y in data:
        fire(0)
        fire(1)
        fire(2)
        opt.zero_grad(set_to_none=True)
        fire(3)
        out = model(x)
        fire(4)
        fire(5)
        state.loss = loss = loss_fn(out, y)
        fire(6)
        fire(7)
        loss.backward()
        fire(8)
        opt.step()
        fire(9)
        state.step += 1
        fire(10)
        fire(11)
