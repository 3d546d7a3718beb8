"""What verifying a checkpoint's CRC-32s adds to loading it (issue 32, item 3).

    python benchmarks/investigations/bench_checkpoint_verify.py [--gib 1] [--rounds 5] [--dir DIR]
    python benchmarks/investigations/bench_checkpoint_verify.py --sharded   # a DCP folder (issue 43)

Writes one checkpoint of ``--gib`` GiB of float32 tensors (16 tensors, as a model's layers)
with ``trainbus.checkpoint.format.write_atomic``, then times, interleaved over ``--rounds``
rounds with a warm page cache (the file was just written or read):

- ``verify``: ``verify_archive`` alone (``zlib.crc32`` over every member);
- ``load``: ``torch.load(weights_only=True)`` alone (what loading cost before);
- ``verify+load``: both, one after the other, as ``Trainer(load_path=...)`` now does.

``--sharded``: the same tensors saved as a sharded checkpoint (``dcp.save`` with trainbus's
``ChecksumWriter``, one process), ``verify`` is ``trainbus.checkpoint.dcp_files.verify`` over its
files and ``load`` is ``dcp.load`` (through ``SafeReader``) into tensors of the same shapes.

Prints median [min-max] seconds and GB/s, and the median share verification adds to a
load. A cold cache (a checkpoint read from disk for the first time) makes both the read
and the CRC wait for the disk; the figure here is the CPU cost on top of a cached read.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import tempfile
import time

import torch

from trainbus.checkpoint.dcp_files import ChecksumWriter, SafeReader, verify
from trainbus.checkpoint.format import safe_globals, verify_archive, write_atomic


def sharded_arms(folder: pathlib.Path, model: dict[str, torch.Tensor]) -> tuple[dict[str, object], int]:
    """Save ``model`` as a DCP folder; the arms verify / load / verify+load and its size."""
    import warnings

    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
    dcp_save({"model": model}, storage_writer=ChecksumWriter(str(folder)), no_dist=True)
    target = {"model": {k: torch.empty_like(v) for k, v in model.items()}}
    size = sum(p.stat().st_size for p in folder.iterdir() if p.suffix == ".distcp")

    def load() -> None:
        dcp_load(target, storage_reader=SafeReader(str(folder)), no_dist=True)

    def both() -> None:
        verify(folder)
        load()

    return {"verify": lambda: verify(folder), "load": load, "verify+load": both}, size


def timed(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--sharded", action="store_true", help="a DCP folder, not a file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    n = int(args.gib * 2**30 / 4 / 16)
    payload = {"trainbus_checkpoint": 1, "model": {f"layer{i}": torch.rand(n) for i in range(16)}}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        if args.sharded:
            arms, size = sharded_arms(pathlib.Path(tmp) / "dcp", payload["model"])
            del payload
            times = run_rounds(arms, args.rounds)
            report(times, size, args.rounds)
            return
        path = pathlib.Path(tmp) / "big.pt"
        write_atomic(path, payload)
        del payload
        size = path.stat().st_size

        def load() -> None:
            with safe_globals():
                torch.load(path, map_location="cpu", weights_only=True)

        def both() -> None:
            verify_archive(path)
            load()

        arms = {"verify": lambda: verify_archive(path), "load": load, "verify+load": both}
        times = run_rounds(arms, args.rounds)
    report(times, size, args.rounds)


def run_rounds(arms: dict[str, object], rounds: int) -> dict[str, list[float]]:
    for fn in arms.values():  # warm the page cache and the allocator
        fn()  # type: ignore[operator]
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(rounds):
        for name, fn in arms.items():
            times[name].append(timed(fn))
    return times


def report(times: dict[str, list[float]], size: int, rounds: int) -> None:
    print(f"checkpoint: {size / 1e9:.2f} GB, {rounds} interleaved rounds, warm page cache")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(
            f"{name:12s} {med:6.3f} s [{min(ts):.3f}-{max(ts):.3f}]  {size / 1e9 / med:5.2f} GB/s"
        )
    shares = [v / lo for v, lo in zip(times["verify"], times["load"], strict=True)]
    print(f"verify / load (paired per round): median {statistics.median(shares):.2f} "
          f"[{min(shares):.2f}-{max(shares):.2f}]")  # fmt: skip


if __name__ == "__main__":
    main()
