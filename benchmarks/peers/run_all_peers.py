"""Run every peer runner x scenario x workload, one subprocess at a time, and collect the results.

Each peer runs on its own interpreter (plain: this Python; the others: the venvs
made by benchmarks/setup_peers.sh). A LatencyServer process (20 ms) serves the
upload scenario. Results go to benchmarks/.out/peers.json; a table of medians,
extra ms/batch over the plain loop and us per no-op handler call is printed.
Run on an otherwise idle machine: each result notes the 1-min load average.

    python benchmarks/peers/run_all_peers.py              # full run
    python benchmarks/peers/run_all_peers.py --quick      # smoke run: 3 reps, fewer scenarios
    python benchmarks/peers/run_all_peers.py --peers plain,ignite --workloads mlp
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
OUT = BENCH / ".out" / "peers.json"
PEERS = {
    "plain": Path(sys.executable),
    "trainbus": Path(sys.executable),
    "lightning": BENCH / ".venvs/lightning/bin/python",
    "ignite": BENCH / ".venvs/ignite/bin/python",
    "composer": BENCH / ".venvs/composer/bin/python",
}
# workload -> scenarios; d1 (the plain loop's 5 ms-sleep baseline for d) runs on plain only.
# Scenarios with a dash are trainbus's own variants (async twins, @blocking, max_lag=1).
FULL = {"mlp": "a b c d e d1 b-async c-async b-blocking d-async d-lag1 e-async",
        "large": "a d e d1 d-async d-lag1"}
QUICK = {"mlp": "a b d e d1 b-async d-async", "large": ""}


def runs_on(peer: str, scenario: str) -> bool:
    """d1 is the plain loop's baseline; dashed scenarios exist only for trainbus."""
    if scenario == "d1":
        return peer == "plain"
    if "-" in scenario:
        return peer == "trainbus"
    return True


def run_one(peer: str, workload: str, scenario: str, reps: int, url: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [str(PEERS[peer]), str(BENCH / "peers" / f"run_{peer}.py"), "--scenario", scenario,
               "--workload", workload, "--reps", str(reps), "--json", str(out), "--upload-url", url]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if proc.returncode or not out.exists():
            raise RuntimeError(f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
        print("  " + proc.stdout.strip().splitlines()[-1], flush=True)
        # 1-min load average at the end: above ~1.2 on 2 cores, something else ran meanwhile
        return {**json.loads(out.read_text()), "loadavg_1min": os.getloadavg()[0]}


def summarize(results: list[dict]) -> str:
    """Markdown table: median ms/batch, extra over plain, us per no-op handler call."""
    med = {(r["framework"], r["workload"], r["scenario"]): r for r in results}
    lines = ["| workload | scenario | framework | median (min) ms/batch | extra over plain | note |",
             "|---|---|---|---|---|---|"]
    for (fw, wk, sc), r in med.items():
        m = statistics.median(r["ms_per_batch"])
        plain = med.get(("plain", wk, sc.split("-")[0]))
        extra = f"{m - statistics.median(plain['ms_per_batch']):+.3f} ms" if plain else ""
        note = ""
        base, plain_a = med.get((fw, wk, "a")), med.get(("plain", wk, "a"))
        calls = r["handler_calls_per_batch"]
        if sc.split("-")[0] in ("b", "c") and base and plain_a and calls:
            own = (m - statistics.median(base["ms_per_batch"])) * 1e3 / calls
            gross = (m - statistics.median(plain_a["ms_per_batch"])) * 1e3 / calls
            note = (f"{own:.2f} us per handler call over its own (a), {gross:.2f} us over "
                    f"plain (a) ({calls} calls/batch)")
        if sc == "a" and r.get("setup_ms"):
            note = f"setup before the first batch {statistics.median(r['setup_ms']):.0f} ms"
        d1 = med.get(("plain", wk, "d1"))
        if sc.startswith("d") and sc != "d1" and d1:
            note = f"{m - statistics.median(d1['ms_per_batch']):+.3f} ms over plain d1 (one 5 ms sleep)"
        lines.append(f"| {wk} | {sc} | {fw} {r['version']} | {m:.3f} ({min(r['ms_per_batch']):.3f}) "
                     f"| {extra} | {note} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 reps, scenarios of QUICK")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--workloads", default="mlp,large")
    parser.add_argument("--scenarios", help="comma-separated; default: all of the plan")
    parser.add_argument("--reps", type=int, help="default 15 (mlp) / 5 (large); 3 with --quick")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    wanted = set(args.scenarios.split(",")) if args.scenarios else None

    server = subprocess.Popen([sys.executable, str(BENCH / "latency_server.py"), "--port", "0",
                               "--latency-ms", "20"], stdout=subprocess.PIPE, text=True)
    results, failures, t0, load0 = [], [], time.monotonic(), os.getloadavg()
    try:
        url = server.stdout.readline().strip()
        for workload in args.workloads.split(","):
            reps = args.reps or (3 if args.quick else 11 if workload == "mlp" else 3)
            for scenario in plan.get(workload, "").split():
                if wanted and scenario not in wanted:
                    continue
                for peer in args.peers.split(","):
                    if not runs_on(peer, scenario):
                        continue
                    print(f"{peer} {workload}/{scenario} x{reps}", flush=True)
                    try:
                        results.append(run_one(peer, workload, scenario, reps, url))
                    except Exception as exc:  # keep going: one broken peer must not stop the run
                        print(f"  FAILED: {exc}", flush=True)
                        failures.append({"peer": peer, "workload": workload,
                                         "scenario": scenario, "error": str(exc)})
    finally:
        server.terminate()
        server.wait()
    table = summarize(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count(), "quick": args.quick,
                    # other processes skew timings: the 1/5/15-min load average before and after
                    "loadavg_before": load0, "loadavg_after": os.getloadavg()},
        "wall_s": round(time.monotonic() - t0, 1), "results": results,
        "failures": failures, "table": table,
    }, indent=1) + "\n")
    print(f"\n{table}\n\nwrote {args.out} ({len(results)} results, {len(failures)} failures)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
