"""A 500 MB checkpoint uploaded to S3 (moto's server) every 20 batches: the training thread's stall.

Workload: ``Embedding(V, 1024, sparse=True)`` sized so the weights are ``--mb`` (500) MB,
then ``--depth`` (2) ``Linear(1024, 1024)`` layers and ``Linear(1024, 10)``; plain SGD (no
optimizer state: a checkpoint is the weights), batches of 256 x 8 token ids, CPU, one
torch thread. ``--batches`` (40) batches, a checkpoint every ``--every`` (20). The store is
``python -m moto.server`` on 127.0.0.1 in a subprocess (its CPU is not this process's, but
it shares the machine's cores with training, as a local MinIO would).

Methods, run in one process, rounds interleaved (each round runs every method once, in a
rotated order):

    none         no checkpoints (the baseline ms/batch)
    saver        CheckpointSaver(save_interval="20ba", num_checkpoints_to_keep=1) alone: the
                 local checkpoints without upload (what the upload adds is uploader - saver)
    uploader     CheckpointSaver(save_interval="20ba", num_checkpoints_to_keep=1) and
                 CheckpointUploader(saver, "s3://bench/<run>"): host copy on the training
                 thread; write on the saver's writer; upload (obstore, 16 MiB parts, 8 in
                 flight) on the uploader's loop
    sync upload  a @blocking callback at BATCH_CHECKPOINT: torch.save to a local file, then
                 boto3 ``upload_file`` (multipart, 16 MiB parts, 8 threads), on the training
                 thread (what a loop that uploads in its checkpoint hook does)

Reported per method (median over rounds, [min-max]):

    stall/ckpt   time the training thread spent in the method's BATCH_CHECKPOINT handler
                 per checkpoint (uploader: the saver's handler: waiting for the previous
                 write and hand-off, and the host copy)
    train ms/b   (wall time of fit() - drain) / batches: what training took per batch
    ms/batch     wall time of fit() / batches (close included: every upload is done)
    drain s      time from the end of the last batch to fit() returning (the uploads still
                 in flight at the end; the sync method has none)
    MB/s         the upload throughput: uploader: all bytes over the span from the first
                 hand-off to fit() returning (uploads overlap, up to 2 in flight); sync:
                 the file over its upload_file call, median

    server CPU s the moto server's CPU seconds during the run (a real S3 spends none of
                 this machine's)

and the paired ratio ``sync upload stall / uploader stall`` per round.

Run:  python benchmarks/bench_s3_checkpoint.py                      (about 5 minutes)
      python benchmarks/bench_s3_checkpoint.py --mb 50 --rounds 1   (a quick run, < 1 min)
Needs the s3 and test extras (obstore, moto[server], boto3) and ~2 GB of free memory.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import trainbus
from trainbus import Callback, Trainer
from trainbus.callbacks import CheckpointSaver, CheckpointUploader

DIM, BATCH, MiB = 1024, 256, 1024 * 1024
KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


class BigModel(torch.nn.Module):
    """``mb`` MB of embedding weights (sparse gradients), then ``depth`` dense layers."""

    def __init__(self, mb: int, depth: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.vocab = max(1024, mb * 1_000_000 // (4 * DIM))
        self.emb = torch.nn.Embedding(self.vocab, DIM, sparse=True)
        self.body = torch.nn.Sequential(
            *[m for _ in range(depth) for m in (torch.nn.Linear(DIM, DIM), torch.nn.ReLU())]
        )
        self.head = torch.nn.Linear(DIM, 10)

    def forward(self, batch: Any) -> torch.Tensor:
        return self.head(self.body(self.emb(batch[0]).mean(dim=1)))

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(outputs, batch[1])


def loader(batches: int, vocab: int) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (batches * BATCH, 8), generator=g)
    y = torch.randint(0, 10, (batches * BATCH,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=BATCH)


def timed(times: list[float], fn: Callable[[], None]) -> None:
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)


class TimedSaver(CheckpointSaver):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stalls: list[float] = []

    @trainbus.blocking
    def batch_checkpoint(self, state: Any, logger: Any) -> None:
        if self._is_due(trainbus.Event.BATCH_CHECKPOINT, state):
            timed(self.stalls, lambda: CheckpointSaver.batch_checkpoint(self, state, logger))


class SyncUpload(Callback):
    def __init__(self, folder: Path, every: int, endpoint: str, bucket: str) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig

        self.folder, self.every, self.bucket = folder, every, bucket
        self.client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **KEYS)
        self.config = TransferConfig(multipart_chunksize=16 * MiB, max_concurrency=8)
        self.stalls: list[float] = []
        self.mb_s: list[float] = []

    @trainbus.blocking
    def batch_checkpoint(self, state: Any, logger: Any) -> None:
        if int(state.timer.batch) % self.every == 0:
            timed(self.stalls, lambda: self._save(int(state.timer.batch), state))

    def _save(self, batch: int, state: Any) -> None:
        path = self.folder / f"ba{batch}.pt"
        torch.save(state.model.state_dict(), path)
        t0 = time.perf_counter()
        self.client.upload_file(str(path), self.bucket, path.name, Config=self.config)
        self.mb_s.append(path.stat().st_size / MiB / (time.perf_counter() - t0))
        path.unlink()


class LastBatch(Callback):
    @trainbus.blocking
    def batch_end(self, state: Any, logger: Any) -> None:
        self.at = time.perf_counter()


METHODS = ("none", "saver", "uploader", "sync upload")


def run_once(
    method: str, args: argparse.Namespace, endpoint: str, root: Path, server: Any
) -> dict[str, Any]:
    import boto3

    folder = Path(tempfile.mkdtemp(dir=root))
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **KEYS).create_bucket(
        Bucket=bucket
    )
    model = BigModel(args.mb, args.depth)
    last = LastBatch()
    callbacks: list[Callback] = [last]
    saver: TimedSaver | None = None
    first: list[float] = []
    uploader: CheckpointUploader | None = None
    sync: SyncUpload | None = None
    if method == "saver":
        saver = TimedSaver(folder, "ba{batch}.pt", save_interval=f"{args.every}ba",
                           num_checkpoints_to_keep=1)  # fmt: skip
        callbacks.append(saver)
    elif method == "uploader":
        saver = TimedSaver(folder, "ba{batch}.pt", save_interval=f"{args.every}ba",
                           num_checkpoints_to_keep=1)  # fmt: skip
        uploader = CheckpointUploader(
            saver, f"s3://{bucket}/run", endpoint_url=endpoint, access_key_id="testing",
            secret_access_key="testing",
        )  # fmt: skip
        saver.add_listener(lambda ts, path: first.append(time.perf_counter()))
        callbacks += [saver, uploader]
    elif method == "sync upload":
        sync = SyncUpload(folder, args.every, endpoint, bucket)
        callbacks.append(sync)
    trainer = Trainer(
        model, loader(args.batches, model.vocab), "1ep",
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1), callbacks=callbacks,
        device="cpu", warn_slow_callbacks=False, close_timeout=600.0,
    )  # fmt: skip
    cpu0 = sum(server.cpu_times()[:2])
    t0 = time.perf_counter()
    trainer.fit_sync()
    end = time.perf_counter()
    out: dict[str, Any] = {"ms_per_batch": (end - t0) / args.batches * 1e3}
    out["server_cpu_s"] = sum(server.cpu_times()[:2]) - cpu0
    out["drain_s"] = end - last.at
    if saver is not None and uploader is not None:
        st = uploader.statistics()
        out["stall_ms"] = statistics.fmean(saver.stalls) * 1e3
        out["stalls_ms"] = [s * 1e3 for s in saver.stalls]
        out["mb_s"] = st.bytes_uploaded / MiB / (end - first[0])
        out["mb_s_each"] = st.bytes_uploaded / MiB / st.upload_seconds
        out["uploads"] = st.uploaded
        out["host_copy_ms"] = saver.statistics().capture_seconds / saver.statistics().saves * 1e3
        out["ckpt_mb"] = saver.statistics().bytes_written / saver.statistics().written / MiB
    elif saver is not None:
        out["stall_ms"] = statistics.fmean(saver.stalls) * 1e3
        out["stalls_ms"] = [s * 1e3 for s in saver.stalls]
    elif sync is not None:
        out["stall_ms"] = statistics.fmean(sync.stalls) * 1e3
        out["stalls_ms"] = [s * 1e3 for s in sync.stalls]
        out["mb_s"] = statistics.median(sync.mb_s)
        out["uploads"] = len(sync.mb_s)
    shutil.rmtree(folder, ignore_errors=True)
    return out


def fmt(values: list[float], p: int = 0) -> str:
    return f"{statistics.median(values):.{p}f} [{min(values):.{p}f}-{max(values):.{p}f}]"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=500, help="checkpoint size (MB)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--depth", type=int, default=2, help="dense layers (step cost)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="bench_s3-"))
    import psutil

    watched = psutil.Process(server.pid)
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS}
    try:
        for _ in range(100):  # polling: a process of its own has no event to wait on
            try:
                urllib.request.urlopen(endpoint, timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        for r in range(args.rounds):
            order = METHODS[r % len(METHODS) :] + METHODS[: r % len(METHODS)]
            for method in order:
                results[method].append(run_once(method, args, endpoint, root, watched))
                print(f"round {r} {method:11s} {results[method][-1]}", file=sys.stderr)
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(root, ignore_errors=True)
    up = results["uploader"]
    print(
        f"\n{args.batches} batches, a {up[0]['ckpt_mb']:.0f} MiB checkpoint every {args.every}; "
        f"{args.rounds} rounds; median [min-max]"
    )
    print("| method | stall/ckpt ms | train ms/batch | ms/batch | drain s | upload MB/s "
          "| server CPU s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for m in METHODS:
        ms = [x["ms_per_batch"] for x in results[m]]
        train = [x["ms_per_batch"] - x["drain_s"] * 1e3 / args.batches for x in results[m]]
        cells = [fmt([x[k] for x in results[m]], p) if m != "none" else "-"
                 for k, p in (("stall_ms", 0),)]  # fmt: skip
        drain = fmt([x["drain_s"] for x in results[m]], 1)
        mbs = fmt([x["mb_s"] for x in results[m]]) if "mb_s" in results[m][0] else "-"
        cpu = fmt([x["server_cpu_s"] for x in results[m]], 1)
        print(f"| {m} | {cells[0]} | {fmt(train)} | {fmt(ms)} | {drain} | {mbs} | {cpu} |")
    ratio = [s["stall_ms"] / u["stall_ms"] for s, u in zip(results["sync upload"], up, strict=True)]
    print(f"\nsync upload stall / uploader stall (paired per round): {fmt(ratio, 1)}")
    print(f"uploader host copy per checkpoint ms: {fmt([x['host_copy_ms'] for x in up])}")
    print(f"uploader MB/s of one upload (start to completion): {fmt([x['mb_s_each'] for x in up])}")
    print(f"uploader stalls per checkpoint ms (all rounds): "
          f"{[round(s) for x in up for s in x['stalls_ms']]}")  # fmt: skip
    out = {"args": vars(args) | {"json": None}, "results": results}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
