"""A plain (or ``async def``, ``@blocking``) handler call's instructions on one tree, quickly:
the suite's callgrind runner on two configs, with none and with N no-op callbacks.

    python benchmarks/investigations/call_count.py SRC [--scenario noop] [--callbacks 10]

Prints the empty batch (training thread, all threads) and the per-call figure, (a batch
with N callbacks - a batch with none) / (N x 12 events), as the suite's ``call_plain`` row
computes it, without the neighbour pass or the peers (about a minute a tree).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))

from harness import runner  # noqa: E402
from suite._calls import CALLS_PER_CALLBACK  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="the trainbus source tree (its src/)")
    parser.add_argument("--scenario", default="noop", help="noop, noop-async, noop-blocking")
    parser.add_argument("--callbacks", type=int, default=10)
    args = parser.parse_args()
    runner.TRAINBUS_SRC = args.src.resolve()
    configs = [{"scenario": "noop", "n": 0, "batches": [10, 30]},
               {"scenario": args.scenario, "n": args.callbacks, "batches": [10, 30]}]
    empty, loaded = runner.callgrind("trainbus_fw", configs, loaded=False)
    calls = args.callbacks * CALLS_PER_CALLBACK["trainbus_fw"]
    print(f"{args.src}: empty batch {empty['train']:,.0f} training thread, {empty['all']:,.0f} "
          f"all threads; {args.scenario} x {args.callbacks}: a call "
          f"{(loaded['train'] - empty['train']) / calls:,.0f} training thread, "
          f"{(loaded['all'] - empty['all']) / calls:,.0f} all threads")


if __name__ == "__main__":
    main()
