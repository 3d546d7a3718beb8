"""How far a row's "on vs off" instruction delta moves when nothing changes: the same two
configs, alternated in one callgrind process, each pair read as the suite reads it.

    python benchmarks/investigations/delta_spread.py SRC [--scenario prometheus] \
        [--batches 10 30] [--pairs 3]

A config's figure is (fit of B2 batches - fit of B1) / (B2 - B1): a fit's fixed costs
cancel only if both fits pay the same. The event loop's thread does not (a fit of 10
batches paid up to ~350k instructions more than one of 30 early in the process, 2026-12-07),
so with B2 - B1 = 20 the same code's "all threads" delta of PrometheusMetrics moved
between pairs from +1.5k to +15.6k a batch (training thread +3.6k to +8.6k); with
``--batches 10 110``, +2.8k to +5.3k (training thread +3.2k to +3.6k). Prints each
pair's figures and delta (all threads, training thread).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))

from harness import runner  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="the trainbus source tree (its src/)")
    parser.add_argument("--scenario", default="prometheus", help="the 'on' config's scenario")
    parser.add_argument("--callbacks", type=int, default=1)
    parser.add_argument("--batches", type=int, nargs=2, default=[10, 30])
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    runner.TRAINBUS_SRC = args.src.resolve()
    off = {"scenario": "noop", "n": 0, "batches": args.batches}
    on = {"scenario": args.scenario, "n": args.callbacks, "batches": args.batches}
    figures = runner.callgrind("trainbus_fw", [off, on] * args.pairs, loaded=False)
    for k in range(args.pairs):
        a, b = figures[2 * k], figures[2 * k + 1]
        print(f"pair {k + 1}: off all {a['all']:,.0f} train {a['train']:,.0f}; "
              f"on all {b['all']:,.0f} train {b['train']:,.0f}; delta all "
              f"{b['all'] - a['all']:+,.0f}, training thread {b['train'] - a['train']:+,.0f}")


if __name__ == "__main__":
    main()
