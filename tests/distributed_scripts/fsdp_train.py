"""One rank of a small FSDP run, for ``tests/test_fsdp.py`` and ``gpu_check.py --ddp``.

Launch it with ``python -m torch.distributed.run --standalone --nproc_per_node=2``
``tests/distributed_scripts/fsdp_train.py OUT --mode train``. The script initialises the
process group itself (``--backend``, gloo by default; FSDP needs it before ``fully_shard``)
and shards an MLP with ``fully_shard`` (``--fsdp1``: ``FullyShardedDataParallel``). It trains
2 epochs of 4 batches per rank with Adam and a ``StepLR``; a ``CheckpointSaver`` in
``OUT/ckpt`` (``--ckpt`` to name another folder) saves every 2 batches and keeps 3. Each
rank writes ``OUT/rank<r>.json`` after ``fit``: the sample ids it trained on, the model's and
the optimizer's full state dicts, the scheduler's learning rate, the batch count and its
saver's list of checkpoints, the number of process groups left after ``fit`` and whether
trainbus's gloo exit handler is installed. ``--load PATH`` resumes (a checkpoint folder, or
the saver's). Like a user's script, it gathers the full state dicts right before it exits
(the case of issue 16: ``trainbus.runtime.gloo_exit``).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.utils.data import DataLoader, TensorDataset

import trainbus
from trainbus import Callback, State, Trainer
from trainbus.callbacks import CheckpointSaver
from trainbus.runtime import gloo_exit as _gloo_exit


class Net(torch.nn.Module):
    """An MLP regressor on batches ``(x, y, sample_id)``."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(4, 8)
        self.out = torch.nn.Linear(8, 1)

    def forward(self, batch: Any) -> torch.Tensor:
        hidden = torch.relu(self.inp(batch[0]))
        out: torch.Tensor = self.out(hidden)  # not a view (FSDP2 warns about views)
        return out

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return F.mse_loss(outputs.squeeze(-1), batch[1])


class Seen(Callback):
    """The sample ids this rank trained on, per epoch (its state is saved per rank)."""

    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def epoch_start(self, state: State, logger: trainbus.Logger) -> None:
        self.seen.append([])

    def batch_end(self, state: State, logger: trainbus.Logger) -> None:
        self.seen[-1].extend(int(i) for i in state.batch[2])

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = state["seen"]


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(8, generator=g)
    return TensorDataset(x, y, torch.arange(8))


def _plain(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().tolist()
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


def shard(model: torch.nn.Module, device: torch.device, fsdp1: bool) -> torch.nn.Module:
    """``fully_shard`` each layer and the root (or wrap in ``FullyShardedDataParallel``)."""
    from torch.distributed.device_mesh import init_device_mesh

    model.to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    if fsdp1:  # with a mesh its state dicts hold DTensors (not the deprecated ShardedTensor)
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel(
            model, device_id=device, device_mesh=mesh, use_orig_params=True
        )
    from torch.distributed.fsdp import fully_shard

    for layer in (model.inp, model.out):  # type: ignore[union-attr]
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--mode", choices=["train", "resume"], default="train")
    parser.add_argument("--load", default=None)
    parser.add_argument("--ckpt", type=Path, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--fsdp1", action="store_true")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ["RANK"])
    device = torch.device(args.device)
    if device.type == "cuda":
        index = device.index if device.index is not None else int(os.environ["LOCAL_RANK"])
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend)
    torch.manual_seed(1234)  # FSDP does not broadcast: every rank starts from the same weights
    model = shard(Net(), device, args.fsdp1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    seen = Seen()
    saver = CheckpointSaver(
        args.ckpt or out / "ckpt", save_interval="2ba", num_checkpoints_to_keep=3
    )
    dataset = data()
    trainer = Trainer(
        model,
        DataLoader(dataset, batch_size=1, shuffle=True),
        "2ep",
        optimizers=optimizer,
        schedulers=scheduler,
        callbacks=[seen, saver],
        device=device,
        seed=7,
        load_path=args.load,
        dist_timeout=60.0,
    )
    trainer.fit_sync()
    groups = len(dist.distributed_c10d._world.pg_map)  # DCP's and the stop agreement's: gone
    full = StateDictOptions(full_state_dict=True)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=full)  # every rank: all of it
    (out / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "world_size": trainer.state.world_size, "seen": seen.seen,
        "model": _plain(model_sd), "optim": _plain(optim_sd["state"]),
        "lr": scheduler.get_last_lr(), "batch": int(trainer.state.timer.batch),
        "wrapper": type(trainer.state.ddp_model).__name__,
        "saved": [[int(ts.batch), str(p[0])] for ts, p in saver.saved_checkpoints],
        "stats": {k: getattr(saver.statistics(), k) for k in ("saves", "written", "host_bytes")},
        "groups_after_fit": groups, "exit_handler": _gloo_exit.registered(),
    }))  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
