"""Checkpointing a 128 MB model every 10 batches: what the training thread pays per save.

Workload: ``Embedding(32768, 1024, sparse=True)``, ``--depth`` (4) ``Linear(1024, 1024)``
layers and ``Linear(1024, 10)`` (37.8 M float32 parameters, 151 MB), plain SGD (no
optimizer state, so a checkpoint is the weights plus a few KB), batches of 256 x 8 token
ids, CPU, one torch thread. The embedding's gradients are sparse, so a step costs what
the dense layers cost (tens of ms here), not 134 MB of updates. Every method saves every
``--every`` (10) batches into a fresh temporary folder on the same disk.

Methods, run in one process, rounds interleaved (each round runs every method once, in
a rotated order, so all share the machine's state):

    none         no checkpoints (the baseline ms/batch)
    saver        trainbus.callbacks.CheckpointSaver(save_interval="10ba"): host copy on
                 the training thread, serialise + write + fsync + rename on its writer
    torch.save   a @blocking callback calling torch.save(state.state_dict(), path) on the
                 training thread at BATCH_CHECKPOINT (what Composer and Ignite do; no fsync)
    dcp.async    torch.distributed.checkpoint.async_save(state_dict, no_dist=True) at
                 BATCH_CHECKPOINT on the training thread, waiting for the previous save's
                 future first (one in flight, as its docs advise); result() at close

Reported per method (median over rounds, [min-max]):

    ms/batch     wall time of fit() / batches (includes close: the last write is done)
    +ms/batch    ms/batch minus ``none`` of the same round, then the median of those
    stall/save   time the training thread spent inside the method's BATCH_CHECKPOINT
                 handler per save (for saver: waiting for a previous write, waiting for
                 earlier handlers, and the host copy): the mean, the first save alone
                 (saver allocates its host buffers there) and the median of the others
                 (saver copies into the buffers of its previous save)
    host copy    saver only: the capture time per save (SaverStatistics)

and the paired ratio ``torch.save stall / saver stall`` per round (target: >= 3x), and
saver's stall against its host copy (target: the stall is the host copy).

Run:  python benchmarks/bench_checkpoint.py [--rounds 3] [--batches 60] [--every 10]
(about 3-5 minutes on 2 shared cores; needs ~1 GB of free disk and memory).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import trainbus
from trainbus import Callback, Trainer
from trainbus.callbacks import CheckpointSaver

VOCAB, DIM, BATCH = 32768, 1024, 256


class BigModel(torch.nn.Module):
    """134 MB of parameters: a sparse-gradient embedding, then ``depth`` dense layers."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(VOCAB, DIM, sparse=True)
        self.body = torch.nn.Sequential(
            *[m for _ in range(depth) for m in (torch.nn.Linear(DIM, DIM), torch.nn.ReLU())]
        )
        self.head = torch.nn.Linear(DIM, 10)

    def forward(self, batch: Any) -> torch.Tensor:
        return self.head(self.body(self.emb(batch[0]).mean(dim=1)))

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(outputs, batch[1])


def loader(batches: int) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (batches * BATCH, 8), generator=g)
    y = torch.randint(0, 10, (batches * BATCH,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=BATCH)


class Stall:
    """Times a handler on the training thread."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def timed(self, fn: Callable[[], None]) -> None:
        t0 = time.perf_counter()
        fn()
        self.times.append(time.perf_counter() - t0)


class TimedSaver(CheckpointSaver):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stall = Stall()

    @trainbus.blocking
    def batch_checkpoint(self, state: Any, logger: Any) -> None:
        if self._is_due(trainbus.Event.BATCH_CHECKPOINT, state):
            self.stall.timed(lambda: CheckpointSaver.batch_checkpoint(self, state, logger))


class SyncTorchSave(Callback):
    def __init__(self, folder: Path, every: int) -> None:
        self.folder, self.every, self.stall = folder, every, Stall()

    @trainbus.blocking
    def batch_checkpoint(self, state: Any, logger: Any) -> None:
        batch = int(state.timer.batch)
        if batch % self.every == 0:
            path = self.folder / f"ba{batch}.pt"
            self.stall.timed(lambda: torch.save(state.state_dict(), path))


class DcpAsyncSave(Callback):
    def __init__(self, folder: Path, every: int) -> None:
        self.folder, self.every, self.stall = folder, every, Stall()
        self.pending: Any = None

    @trainbus.blocking
    def batch_checkpoint(self, state: Any, logger: Any) -> None:
        batch = int(state.timer.batch)
        if batch % self.every == 0:
            self.stall.timed(lambda: self._save(state, batch))

    def _save(self, state: Any, batch: int) -> None:
        import torch.distributed.checkpoint as dcp

        if self.pending is not None:
            self.pending.result()
        sd = {"model": state.model.state_dict(), "optimizers": state.optimizers[0].state_dict()}
        self.pending = dcp.async_save(sd, checkpoint_id=self.folder / f"ba{batch}", no_dist=True)

    def close(self, state: Any, logger: Any) -> None:
        if self.pending is not None:
            self.pending.result()
            self.pending = None


METHODS = ("none", "saver", "torch.save", "dcp.async")


def run_once(method: str, batches: int, every: int, root: Path, depth: int) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp(dir=root))
    cb: Any = None
    if method == "saver":
        cb = TimedSaver(folder, "ba{batch}.pt", save_interval=f"{every}ba")
    elif method == "torch.save":
        cb = SyncTorchSave(folder, every)
    elif method == "dcp.async":
        cb = DcpAsyncSave(folder, every)
    model = BigModel(depth)
    trainer = Trainer(
        model, loader(batches), "1ep", optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        callbacks=[] if cb is None else [cb], device="cpu", warn_slow_callbacks=False,
    )  # fmt: skip
    t0 = time.perf_counter()
    trainer.fit_sync()
    wall = time.perf_counter() - t0
    out = {"ms_per_batch": wall / batches * 1e3}
    if cb is not None:
        out["stall_ms"] = statistics.fmean(cb.stall.times) * 1e3
        out["stall_first_ms"] = cb.stall.times[0] * 1e3
        out["stall_later_ms"] = statistics.median(cb.stall.times[1:]) * 1e3
        out["saves"] = len(cb.stall.times)
    if isinstance(cb, CheckpointSaver):
        st = cb.statistics()
        out["host_copy_ms"] = st.capture_seconds / max(st.saves, 1) * 1e3
        out["write_ms"] = st.write_seconds / max(st.written, 1) * 1e3
        out["mb"] = st.host_bytes / 1e6
    shutil.rmtree(folder, ignore_errors=True)
    return out


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):8.2f} [{min(values):.2f}-{max(values):.2f}]"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--depth", type=int, default=4, help="dense layers (step cost)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    root = Path(tempfile.mkdtemp(prefix="bench_checkpoint-"))
    results: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
    try:
        run_once("saver", 20, 10, root, args.depth)  # warm-up: imports, allocator
        for r in range(args.rounds):
            order = METHODS[r % len(METHODS) :] + METHODS[: r % len(METHODS)]
            for method in order:
                results[method].append(run_once(method, args.batches, args.every, root, args.depth))
                print(f"round {r} {method:10s} {results[method][-1]}", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = [x["ms_per_batch"] for x in results["none"]]
    print(
        f"\n{args.batches} batches, a save every {args.every}; {args.rounds} rounds; "
        f"median [min-max]; model {results['saver'][0]['mb']:.0f} MB"
    )
    print(
        f"{'method':11s} {'ms/batch':>22s} {'+ms/batch':>22s} {'stall/save ms (mean)':>24s}"
        f" {'first save ms':>24s} {'later saves ms':>24s}"
    )
    for m in METHODS:
        ms = [x["ms_per_batch"] for x in results[m]]
        extra = [a - b for a, b in zip(ms, base, strict=True)]
        stalls = [
            fmt([x[k] for x in results[m]]) if m != "none" else "-"
            for k in ("stall_ms", "stall_first_ms", "stall_later_ms")
        ]
        print(f"{m:11s} {fmt(ms):>22s} {fmt(extra):>22s} " + " ".join(f"{x:>24s}" for x in stalls))
    saver = results["saver"]
    host = [x["host_copy_ms"] for x in saver]
    ratio = [
        t["stall_ms"] / s["stall_ms"] for t, s in zip(results["torch.save"], saver, strict=True)
    ]
    ratio_later = [
        t["stall_later_ms"] / s["stall_later_ms"]
        for t, s in zip(results["torch.save"], saver, strict=True)
    ]
    dcp_ratio = [
        d["stall_ms"] / s["stall_ms"] for d, s in zip(results["dcp.async"], saver, strict=True)
    ]
    over_host = [s["stall_ms"] - s["host_copy_ms"] for s in saver]
    print(f"\nsaver host copy per save ms   {fmt(host)}")
    print(f"saver stall - host copy ms    {fmt(over_host)}")
    print(f"saver write per save ms       {fmt([x['write_ms'] for x in saver])} (writer thread)")
    print(f"torch.save stall / saver stall {fmt(ratio)}  (mean per save; target >= 3)")
    print(f"  same, saves after the first  {fmt(ratio_later)}  (medians)")
    print(f"dcp.async stall / saver stall  {fmt(dcp_ratio)}")
    out = {"args": vars(args) | {"json": None}, "results": results}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
