"""A child for tests/failures/test_spinning_handler.py: an ``async def`` handler that spins.

``spinning_handler.py batch_end|close fit_sync|anyio.run`` trains 3 batches with
``close_timeout=5`` and ``wait_warning_seconds=5``; the callback's handler of that name runs
``while True: pass`` (no await). It prints ``spinning`` when it starts, and ``fit
returned`` / ``fit raised <type>`` at the end.
"""

from __future__ import annotations

import sys

import anyio
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainbus import Callback, Trainer

where, runner = sys.argv[1], sys.argv[2]


class Spins(Callback):
    pass


async def spin(self: Spins, state: object, logger: object) -> None:
    print("spinning", flush=True)
    while True:
        pass


setattr(Spins, where, spin)
model = torch.nn.Linear(4, 2)
trainer = Trainer(
    model,
    DataLoader(TensorDataset(torch.randn(12, 4), torch.randint(0, 2, (12,))), batch_size=4),
    "1ep",
    optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
    loss_fn=torch.nn.functional.cross_entropy,
    callbacks=[Spins()],
    close_timeout=5,
    wait_warning_seconds=5,
)
try:
    if runner == "fit_sync":
        trainer.fit_sync()
    else:
        anyio.run(trainer.fit)
except Exception as exc:
    print(f"fit raised {type(exc).__name__}", flush=True)
    print("\n".join(getattr(exc, "__notes__", ())), flush=True)
else:
    print("fit returned", flush=True)
