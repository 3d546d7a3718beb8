"""Row (c)'s fit under two trainbus source trees, interleaved round by round (issue 42).

    python benchmarks/investigations/compare_trees.py OLD/src NEW/src [--rounds 6]
        [--callbacks 100] [--lanes 8] [--batches 100] [--scenario noop|sleep]

Each round runs, for each tree in turn (the order flipped every other round), one fresh
process that imports trainbus from that tree and times three fits of
``investigations/lane_pool.py`` (no-op plain callbacks on every per-batch event, the MLP
workload), each between two plain loops; a round's figure is the median of the three
ratios to the plain loop around them. Printed: each tree's median, min and max over the
rounds, and the paired ratio NEW / OLD of each round. A second tree comes from
``git worktree add --detach /tmp/old <commit>``. Wall clock on a shared machine: read the
paired ratio, and a spread that covers 1.0 means not decided.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

ONE_PROCESS = r"""
import statistics, sys
src, n, lanes, batches, here, scenario = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
sys.path[:0] = [src, here, str(__import__("pathlib").Path(here).parent)]
import trainbus
assert trainbus.__file__.startswith(src), trainbus.__file__
import lane_pool
from harness import workload as wl
w = wl.make_workload("mlp", batches)
ratios = []
for _ in range(3):
    before = lane_pool.plain(w, scenario)
    fit, _threads = lane_pool.fit(w, scenario, n, lanes)
    after = lane_pool.plain(w, scenario)
    ratios.append(fit / ((before + after) / 2))
print(statistics.median(ratios))
"""


def one(src: str, args: argparse.Namespace) -> float:
    out = subprocess.run(
        [sys.executable, "-c", ONE_PROCESS, src, str(args.callbacks), str(args.lanes),
         str(args.batches), str(HERE), args.scenario],
        capture_output=True, text=True, check=True,
    )
    return float(out.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--callbacks", type=int, default=100)
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--scenario", choices=("noop", "sleep"), default="noop",
                        help="no-op callbacks (row (c)), or callbacks sleeping 5 ms at "
                        "BATCH_END over a loop sleeping 5 ms (row (d), with --callbacks 4)")
    args = parser.parse_args()
    trees = [str(Path(args.old).resolve()), str(Path(args.new).resolve())]
    got: dict[str, list[float]] = {tree: [] for tree in trees}
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            got[tree].append(one(tree, args))
    for label, tree in zip(("old", "new"), trees, strict=True):
        v = got[tree]
        print(f"{label} {tree}: {statistics.median(v):.2f}x ({min(v):.2f}-{max(v):.2f})")
    paired = [b / a for a, b in zip(got[trees[0]], got[trees[1]], strict=True)]
    print(f"paired new/old: {statistics.median(paired):.3f} "
          f"({min(paired):.3f}-{max(paired):.3f}) over {args.rounds} rounds")


if __name__ == "__main__":
    main()
