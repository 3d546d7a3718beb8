"""The ``users_callbacks`` row under two trainbus source trees, interleaved round by round.

    python benchmarks/investigations/compare_users_callbacks.py OLD/src NEW/src
        [--rounds 13] [--batches 300]

Each round runs, in a rotated order, one fresh process per arm: the plain loop without I/O
(the floor), the plain loop doing the I/O inline, and trainbus from each tree (with
``--quiet-arm`` also the new tree without its default output and time account; the arms of
``suite/_users_callbacks_arms.py``: progress output, JSON-lines, TensorBoard, LR and
throughput monitors, a checkpoint every 50 batches, on ``g10``). Printed: each arm's ratio
to the floor of its round (median, min-max), each tree's trainbus over the inline loop in
ms a batch, and the paired ratio NEW / OLD of each round. Wall clock on a shared machine: a
spread that covers 1.0 means not decided.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(BENCH)]

from harness.runner import env_for, python_for  # noqa: E402
from suite.users_callbacks import one  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=13)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--quiet-arm", action="store_true",
                        help="also run the new tree with progress=False, track_time=False")
    args = parser.parse_args()
    base = env_for("trainbus_fw")
    python = str(python_for("trainbus_fw"))
    arms: dict[str, tuple[str, dict[str, str]]] = {"floor": ("floor", base),
                                                   "inline": ("inline", base)}
    for label, tree in (("old", args.old), ("new", args.new)):
        env = dict(base, PYTHONPATH=f"{Path(tree).resolve()}:{BENCH}")
        arms[label] = ("trainbus", env)
    if args.quiet_arm:  # the new tree without its default output and time account
        arms["new-quiet"] = ("trainbus-quiet", arms["new"][1])
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    names = list(arms)
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            arm, env = arms[name]
            seconds[name].append(float(one(python, env, arm, args.batches, True)["seconds"]))
        print(f"round {r + 1}/{args.rounds}: "
              + ", ".join(f"{n} {seconds[n][-1]:.2f} s" for n in names), flush=True)
    floor = seconds["floor"]
    for name in names[1:]:
        ratios = [s / f for s, f in zip(seconds[name], floor, strict=True)]
        print(f"{name}: {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
              " of the floor")
    for name in ("old", "new"):
        diff = [(s - i) * 1000 / args.batches
                for s, i in zip(seconds[name], seconds["inline"], strict=True)]
        print(f"{name} over inline: {statistics.median(diff):+.2f} ms a batch "
              f"({min(diff):+.2f} to {max(diff):+.2f}); slower in "
              f"{sum(d > 0 for d in diff)} of {len(diff)} rounds")
    paired = [n / o for n, o in zip(seconds["new"], seconds["old"], strict=True)]
    print(f"paired new/old: {statistics.median(paired):.3f} "
          f"({min(paired):.3f}-{max(paired):.3f}) over {args.rounds} rounds")
    if "new-quiet" in seconds:
        paired = [n / q for n, q in zip(seconds["new"], seconds["new-quiet"], strict=True)]
        print(f"paired new (output and account on) / new-quiet: {statistics.median(paired):.3f}"
              f" ({min(paired):.3f}-{max(paired):.3f}) over {args.rounds} rounds")


if __name__ == "__main__":
    main()
