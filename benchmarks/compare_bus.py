"""The bus before and after a change, side by side: interleaved rounds, paired ratios.

Runs the same functions of ``benchmarks/bench_bus.py`` (producer cost per batch and per
event for 10 plain / async / ``@blocking`` no-op callbacks, 100 plain ones and none, async
throughput, and ``engine.run_event()`` from plain code) against two source trees in alternating
subprocesses, round by round (ABAB), and prints medians and the after/before ratio per
round as min / median / max.

Run:  git worktree add --detach /tmp/before <commit>
      python benchmarks/compare_bus.py --before /tmp/before/src --rounds 3
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import sys

CODE = r'''
BENCH = %r

import sys, json, statistics
sys.path.insert(0, BENCH)
import bench_bus
out = {}
for n, kind, batches in [(10, "sync", 300), (100, "sync", 100), (10, "async", 300),
                         (10, "blocking", 300), (0, "sync", 300)]:
    ev, bar, batch = bench_bus.producer_costs(n, kind, batches)
    out[f"{n} {kind} batch ms"] = batch
    out[f"{n} {kind} event us"] = ev
out["calls/s 10 async"] = bench_bus.throughput(10, 300)
out["run_event us 10"] = bench_bus.plain_run_event(10, 300)
print(json.dumps(out))
'''
HERE = pathlib.Path(__file__).resolve().parent
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--before", required=True, help="the src/ folder of the old tree")
parser.add_argument("--after", default=str(HERE.parent / "src"))
parser.add_argument("--rounds", type=int, default=3)
args = parser.parse_args()
CODE = CODE % str(HERE)
trees = {"before": args.before, "after": args.after}
rounds = args.rounds
res = {k: [] for k in trees}
for _ in range(rounds):
    for name, src in trees.items():
        p = subprocess.run([sys.executable, "-c", CODE], env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=900)
        if p.returncode:
            print(name, p.stderr[-2000:])
            continue
        res[name].append(json.loads(p.stdout.strip().splitlines()[-1]))
keys = list(res["after"][0])
print(f"{'figure':28} {'before med':>11} {'after med':>11} {'after/before (paired) min/med/max':>36}")
for k in keys:
    b = [x[k] for x in res["before"]]
    a = [x[k] for x in res["after"]]
    ratios = [y / x for x, y in zip(b, a, strict=True)]
    print(f"{k:28} {statistics.median(b):11.3f} {statistics.median(a):11.3f}   {min(ratios):.2f} / {statistics.median(ratios):.2f} / {max(ratios):.2f}")
