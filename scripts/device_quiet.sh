#!/usr/bin/env bash
# Quiet-machine figures in one short device call (SPEC section 7 is about a 2-core machine):
# independent benchmarks side by side, each pinned to two cores of its own, so the 16-core
# machine gives each a quiet 2-core box and the call stays under two minutes.
#
#   cores 0,1  compare_bus.py: the bus alone, this tree against .devcarry/base/src
#   cores 2,3  compare_handler_calls.py: cost per no-op handler call vs Ignite (wheel in .whl)
#   cores 4,5  bench_mlflow.py --stub-only --before: MLflowLogger's cost per batch, both trees
#   cores 6-15 device_trailing.sh: scenario (g) pinned to 6,7, then on 8-15 ("unpinned")
#
# Needs (both in .git/info/exclude, passed with carry): .devcarry/base/src (the old tree's
# src/) and .whl (pytorch_ignite wheel). Run from the repo root; figures go to $OUT.
set -u
OUT="${OUT:-device-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD/src:/tmp/site"
job() { local name=$1 cores=$2 limit=$3; shift 3
  ( t0=$SECONDS; timeout "$limit" taskset -c "$cores" "$@" > "$OUT/$name.txt" 2>&1
    echo "=== $name: rc=$? in $((SECONDS - t0)) s (cores $cores)" >> "$OUT/$name.txt" ) & }
uptime
job compare_bus 0,1 95 python benchmarks/compare_bus.py --before .devcarry/base/src --rounds 2
job handler_calls 2,3 95 python benchmarks/peers/compare_handler_calls.py --rounds 3 --reps 2 \
  --ignite-python "$(command -v python)"
job mlflow 4,5 95 python benchmarks/bench_mlflow.py --stub-only --before .devcarry/base/src \
  --rounds 2 --reps 1 --repeat 1
( PIN=6,7 FREE=8-15 OUT="$OUT" bash scripts/device_trailing.sh > "$OUT/trailing.txt" 2>&1 ) &
wait
uptime
for f in compare_bus handler_calls mlflow trailing; do echo "##### $f"; tail -n 30 "$OUT/$f.txt"; done
