"""The training functions the Ray tests give ``TorchTrainer`` (they run in Ray's workers).

Ray pickles them by value (``tests/integrations/test_ray.py`` registers this module), so a
worker needs trainbus importable, not the tests.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import torch

#: Batches per epoch on each of the 2 ranks (64 samples, 8 a batch), and epochs.
BATCHES, EPOCHS = 4, 3


def _data() -> Any:
    from torch.utils.data import DataLoader, TensorDataset

    gen = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(64, 4, generator=gen), torch.randint(0, 2, (64,), generator=gen)
    data = TensorDataset(inputs, targets)
    return DataLoader(data, batch_size=8, shuffle=True)


def train_loop(config: dict[str, Any]) -> None:
    """A 2-rank fit with a saver every 2 batches, a JSON-lines log and a RayReporter.

    ``config``: ``out`` (a folder), optionally ``kill_at`` (rank 1 SIGKILLs itself at that
    batch in the first attempt, once Ray has committed the report of the batch before it)
    and ``rank_zero_reporter`` (mark the reporter rank-zero-only: refused).
    """
    import ray.train

    from trainbus import Callback, Trainer, blocking
    from trainbus.callbacks import CheckpointSaver
    from trainbus.integrations.ray import RayReporter, checkpoint_path
    from trainbus.loggers import JSONLinesLogger

    out = Path(config["out"])
    reporter = RayReporter()
    if config.get("rank_zero_reporter"):
        reporter.rank_zero_only = True  # raises ValueError, on every rank
    kill_at = config.get("kill_at")
    marker = out / "killed"

    class KillRankOne(Callback):
        @blocking
        def batch_end(self, state: Any, logger: Any) -> None:
            if state.rank != 1 or int(state.timer.batch) != kill_at or marker.exists():
                return
            # The report of the batch before is Ray's (committed) before this rank dies.
            while reporter.reported < (kill_at - 1) // 2:
                threading.Event().wait(0.01)
            from ray.train import CheckpointConsistencyMode

            ray.train.get_all_reported_checkpoints(
                consistency_mode=CheckpointConsistencyMode.COMMITTED
            )
            marker.write_text("1")
            os.kill(os.getpid(), signal.SIGKILL)

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    rank = ray.train.get_context().get_world_rank()
    load_path = checkpoint_path()
    trainer = Trainer(
        model,
        _data(),
        f"{EPOCHS}ep",
        loss_fn=torch.nn.functional.cross_entropy,
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        seed=0,
        device="cpu",
        callbacks=[CheckpointSaver(out / "ckpt", save_interval="2ba"), KillRankOne()],
        loggers=[JSONLinesLogger(out / "metrics.jsonl"), reporter],
        load_path=load_path,
    )
    if rank == 0:
        with open(out / "starts.txt", "a") as f:
            state = trainer.state
            f.write(f"{int(state.timer.batch)} {state.world_size} {state.device}\n")
    trainer.fit_sync()
    if rank == 0:
        torch.save(
            {"model": model.state_dict(), "optimizer": trainer.state.optimizers[0].state_dict()},
            out / "final.pt",
        )



def drain_loop(config: dict[str, Any]) -> None:
    """``train_loop``'s fit, saving every 3 batches, whose node Ray drains at batch 4.

    ``config``: ``out`` (a folder), ``gcs_address`` and ``drain_in`` (seconds). In the
    first attempt rank 0 asks Ray's GCS, at batch 4's ``BATCH_END``, to drain its node
    for preemption with a deadline ``drain_in`` seconds away (the RPC behind
    ``ray drain-node``), and writes the deadline (Unix ms) to ``out/drain.json``; then
    every rank holds the training thread there until Ray's watcher has marked it (its
    copy of ``ray.train.PreemptionInfo``), so that the drain notice is given at batch 4's
    boundary on every rank. Each rank writes its ``state.preemption`` at ``FIT_END``
    (``out/notice-rank{r}.json``). The fit goes through ``integrations.ray.fit_sync``.
    """
    import json
    import time

    import ray.train
    from ray.core.generated import autoscaler_pb2
    from ray.train.v2._internal.execution.context import get_train_context

    from trainbus import Callback, Trainer, blocking
    from trainbus.callbacks import CheckpointSaver
    from trainbus.integrations.ray import RayReporter, checkpoint_path, fit_sync
    from trainbus.loggers import JSONLinesLogger

    out = Path(config["out"])
    rank = ray.train.get_context().get_world_rank()

    class DrainAtFour(Callback):
        @blocking
        def batch_end(self, state: Any, logger: Any) -> None:
            if int(state.timer.batch) != 4:
                return
            if rank == 0:
                deadline_ms = int(time.time() * 1000) + int(config["drain_in"] * 1000)
                gcs = ray._raylet.GcsClient(address=config["gcs_address"])
                accepted, why = gcs.drain_node(
                    ray.get_runtime_context().get_node_id(),
                    autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
                    "trainbus test: drain the workers' node",
                    deadline_ms,
                )
                assert accepted, why
                node = ray.get_runtime_context().get_node_id()
                (out / "drain.json").write_text(
                    json.dumps({"deadline_ms": deadline_ms, "node": node})
                )
            context = get_train_context().preemption_context
            waited = threading.Event()
            for _ in range(1200):  # Ray's watcher polls every 0.5 s here (the test's env)
                if context.preemption_info is not None:
                    return
                waited.wait(0.1)
            raise RuntimeError(f"rank {rank}: Ray's drain notice did not come within 120 s")

    class WriteNotice(Callback):
        def fit_end(self, state: Any, logger: Any) -> None:
            notice = state.preemption
            if notice is None:
                return
            wall = notice.deadline - time.monotonic() + time.time()  # back to Unix time
            (out / f"notice-rank{rank}.json").write_text(json.dumps({
                "reason": notice.reason, "source": notice.source,
                "deadline_unix": wall, "batch": int(state.timer.batch),
            }))

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    load_path = checkpoint_path()
    trainer = Trainer(
        model,
        _data(),
        f"{EPOCHS}ep",
        loss_fn=torch.nn.functional.cross_entropy,
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        seed=0,
        device="cpu",
        callbacks=[
            CheckpointSaver(out / "ckpt", save_interval="3ba"), DrainAtFour(), WriteNotice()
        ],
        loggers=[JSONLinesLogger(out / "metrics.jsonl"), RayReporter()],
        load_path=load_path,
    )
    if rank == 0:
        with open(out / "starts.txt", "a") as f:
            f.write(f"{int(trainer.state.timer.batch)} {trainer.state.world_size}\n")
    fit_sync(trainer)
