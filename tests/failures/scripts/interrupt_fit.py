"""A training run for the Ctrl-C tests (tests/failures/test_ctrl_c.py): trains until
interrupted, printing its progress to stdout for the test to synchronise on.

    python interrupt_fit.py --backend trio --out m.jsonl [--stuck] [--slow-close]
        [--close-timeout 2]

stdout: ``logged N`` after each probe point was accepted by the logger, ``stuck`` when
the stuck handler (``--stuck``) has started to block, ``closing`` when the JSON-lines
destination's ``close`` has started (with ``--slow-close`` it then takes 0.5 s before it
writes the file out: a close still working when a second Ctrl-C comes), and at the end
``raised <ExceptionType> probes=<points logged>`` (exit status 130 for a
``KeyboardInterrupt``; anything else propagates and fails the run).
"""

from __future__ import annotations

import argparse
import sys
import threading
import traceback
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from trainbus import Callback, Trainer
from trainbus.loggers import JSONLinesLogger


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.pause = threading.Event()

    def forward(self, batch: Any) -> torch.Tensor:
        self.pause.wait(0.005)  # a batch's work: ~5 ms
        out: torch.Tensor = self.lin(batch[0])
        return out

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(outputs, batch[1])


class Probe(Callback):
    def __init__(self) -> None:
        self.logged = 0

    def batch_end(self, state: Any, logger: Any) -> None:
        logger.log_metrics({"probe": float(int(state.timer.batch))})
        self.logged += 1
        sys.stdout.write(f"logged {self.logged}\n")


class StuckBatchEnd(Callback):
    """A plain handler that blocks for good at batch 5 (a hung network call, say)."""

    def batch_end(self, state: Any, logger: Any) -> None:
        if int(state.timer.batch) == 5:
            sys.stdout.write("stuck\n")
            threading.Event().wait()


class SlowClose(JSONLinesLogger):
    def close(self, state: Any, logger: Any) -> None:
        sys.stdout.write("closing\n")
        sys.stdout.flush()
        if self.slow:
            threading.Event().wait(0.5)  # a flush to a slow disk, say
        super().close(state, logger)

    slow = False


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--out", required=True)
    parser.add_argument("--stuck", action="store_true")
    parser.add_argument("--slow-close", action="store_true")
    parser.add_argument("--close-timeout", type=float, default=30.0)
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    x, y = torch.randn(80, 4), torch.randint(0, 3, (80,))
    probe = Probe()
    callbacks: list[Callback] = [probe]
    if args.stuck:
        callbacks.append(StuckBatchEnd())
    destination = SlowClose(args.out, flush_seconds=60.0)  # written out by close
    destination.slow = args.slow_close
    trainer = Trainer(
        Model(),
        DataLoader(TensorDataset(x, y), batch_size=4),
        "100000ep",  # ends only when interrupted
        callbacks=callbacks,
        loggers=[destination],
        log_train_loss=False,
        close_timeout=args.close_timeout,
    )
    try:
        trainer.fit_sync(backend=args.backend)
    except KeyboardInterrupt as exc:
        traceback.print_exc()
        print(f"raised {type(exc).__name__} probes={probe.logged}", flush=True)
        return 130
    print(f"finished probes={probe.logged}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
