"""What verifying a checkpoint's CRC-32s adds to loading it (issue 32, item 3).

    python benchmarks/investigations/bench_checkpoint_verify.py [--gib 1] [--rounds 5] [--dir DIR]

Writes one checkpoint of ``--gib`` GiB of float32 tensors (16 tensors, as a model's layers)
with ``trainbus.checkpoint.format.write_atomic``, then times, interleaved over ``--rounds``
rounds with a warm page cache (the file was just written or read):

- ``verify``: ``verify_archive`` alone (``zlib.crc32`` over every member);
- ``load``: ``torch.load(weights_only=True)`` alone (what loading cost before);
- ``verify+load``: both, one after the other, as ``Trainer(load_path=...)`` now does.

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

from trainbus.checkpoint.format import safe_globals, verify_archive, write_atomic


def timed(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    n = int(args.gib * 2**30 / 4 / 16)
    payload = {"trainbus_checkpoint": 1, "model": {f"layer{i}": torch.rand(n) for i in range(16)}}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
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
        for fn in arms.values():  # warm the page cache and the allocator
            fn()
        times: dict[str, list[float]] = {name: [] for name in arms}
        for _ in range(args.rounds):
            for name, fn in arms.items():
                times[name].append(timed(fn))
    print(f"checkpoint: {size / 1e9:.2f} GB, {args.rounds} interleaved rounds, warm page cache")
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
