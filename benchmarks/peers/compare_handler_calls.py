"""Per-handler-call cost, trainbus's three kinds against Ignite's call, in interleaved rounds.

Each round runs, one process each and in this order, Ignite (a) and (b), trainbus (a), (b),
(b-blocking) and (b-async) on the MLP workload (``run_ignite.py`` / ``run_trainbus.py``,
``--reps`` epochs each, median ms/batch). Per round: a framework's cost per no-op handler
call = (ms/batch with 10 no-op callbacks - its own (a)) / calls per batch (Ignite: 40,
trainbus: 120). The paired ratio trainbus/Ignite per round is reported as min / median /
max over rounds, so a busy moment hits both sides of a pair alike.

Run:  python benchmarks/peers/compare_handler_calls.py --rounds 5 --reps 3
(needs benchmarks/.venvs/ignite: ``bash benchmarks/setup_peers.sh``)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_all_peers import PEERS, run_one

BENCH = Path(__file__).resolve().parents[1]
RUNS = [("ignite", "a"), ("ignite", "b"), ("trainbus", "a"), ("trainbus", "b"),
        ("trainbus", "b-blocking"), ("trainbus", "b-async")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--ignite-python", type=Path, help="an interpreter with ignite "
                        "installed (default: benchmarks/.venvs/ignite)")
    args = parser.parse_args()
    if args.ignite_python:
        PEERS["ignite"] = args.ignite_python
    server = subprocess.Popen([sys.executable, str(BENCH / "latency_server.py"), "--port", "0",
                               "--latency-ms", "20"], stdout=subprocess.PIPE, text=True)
    per_round: list[dict[str, float]] = []
    try:
        url = (server.stdout.readline() if server.stdout else "").strip()
        for _ in range(args.rounds):
            ms = {}
            for peer, scenario in RUNS:
                result = run_one(peer, "mlp", scenario, args.reps, url)
                ms[(peer, scenario)] = statistics.median(result["ms_per_batch"])
            per_round.append({
                "ignite": (ms["ignite", "b"] - ms["ignite", "a"]) * 1e3 / 40,
                "plain": (ms["trainbus", "b"] - ms["trainbus", "a"]) * 1e3 / 120,
                "@blocking": (ms["trainbus", "b-blocking"] - ms["trainbus", "a"]) * 1e3 / 120,
                "async": (ms["trainbus", "b-async"] - ms["trainbus", "a"]) * 1e3 / 120,
            })
    finally:
        server.terminate()
        server.wait()
    print(f"\n{args.rounds} rounds; us per no-op handler call over the framework's own (a)")
    print(f"{'kind':12} {'median us':>10} {'min':>8} {'max':>8}   vs Ignite (paired) min/med/max")
    for kind in ("ignite", "plain", "@blocking", "async"):
        values = [r[kind] for r in per_round]
        ratios = [r[kind] / r["ignite"] for r in per_round if r["ignite"] > 0]
        paired = (f"{min(ratios):.2f} / {statistics.median(ratios):.2f} / {max(ratios):.2f}"
                  if ratios and kind != "ignite" else "")
        print(f"{kind:12} {statistics.median(values):10.2f} {min(values):8.2f} "
              f"{max(values):8.2f}   {paired}")


if __name__ == "__main__":
    main()
