"""One rank of a 2-rank run whose rank 1 loads each batch 30 ms slower, for
``tests/test_rank_times.py``. Launch with ``python -m torch.distributed.run --standalone
--nproc_per_node=2 tests/distributed_scripts/slow_rank.py OUT`` and
``TRAINBUS_RANK_TIMES_EVERY=8``. Rank 0 writes ``OUT/rank0.json``: each ``ranks/...``
metric it logged, its values in order; the warning goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from trainbus import Trainer
from trainbus.loggers import InMemoryLogger


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, batch: Any) -> torch.Tensor:
        out: torch.Tensor = self.lin(batch[0]).squeeze(-1)
        return out

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return F.mse_loss(outputs, batch[1])


class SlowOnRankOne(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 4, generator=g), torch.randn(n, generator=g)
        self.slow = os.environ.get("RANK") == "1"

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.slow:
            time.sleep(0.03)
        return self.x[i], self.y[i]


def main(out: Path) -> None:
    memory = InMemoryLogger()
    loader = DataLoader(SlowOnRankOne(80), batch_size=1)
    trainer = Trainer(Net(), loader, "1ep", loggers=[memory], device="cpu",
                      log_train_loss=False)  # fmt: skip
    trainer.fit_sync()
    if int(os.environ["RANK"]) == 0:
        logged = {name: [float(v) for _, _, v in values]
                  for name, values in memory.data.items() if name.startswith("ranks/")}  # fmt: skip
        (out / "rank0.json").write_text(json.dumps(logged))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
