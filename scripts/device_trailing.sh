#!/usr/bin/env bash
# Scenario (g)'s headline on a quiet machine, in under 60 s wall: bench_trailing.py's headline
# rows (the scenario: the upload and a @blocking weight reader) pinned to two cores
# (taskset -c 0,1: the SPEC's 2-core machine; the server process inherits the pinning), then
# unpinned the thread-reader rows beside the main headline rows. 50 batches a run (about
# 0.5 s), rounds interleaved within a time budget per pass; one compact table per pass
# (ms/batch median, paired median against its baseline, then per batch the training
# thread's CPU, barrier waits and other off-CPU time (GIL waits), the loop thread's CPU), the
# full tables and the per-round figures in $OUT/g-pinned.json and $OUT/g-free.json.
# Usage (repo root):  bash scripts/device_trailing.sh   (writes to $OUT, else ./device-out)
set -u
OUT="${OUT:-device-out}"; mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
PIN="${PIN:-0,1}"  # the 2 cores of the pinned pass; FREE: the cores of the "unpinned" one
FREE_SET=(); [ -n "${FREE:-}" ] && FREE_SET=(taskset -c "$FREE")
t0=$SECONDS
echo "$(nproc) CPUs; $(uptime)"
python -c "import sys, httpx; print('Python', sys.version.split()[0], 'httpx', httpx.__version__)"
echo "=== pinned to CPUs $PIN, headline rows"
timeout 34 taskset -c "$PIN" python benchmarks/bench_trailing.py --variants headline \
  --batches 50 --rounds 9 --budget-s 26 --compact --json "$OUT/g-pinned.json" 2>&1 | tail -n 16
echo "=== pinned: rc=${PIPESTATUS[0]} at $((SECONDS - t0)) s"
echo "=== unpinned, thread-reader rows and the main headline rows"
rows="plain loop;no upload;trailing(2);tuned httpx, trailing(2);no upload + thread reader"
rows="$rows;trailing(2) + thread reader;max_lag=2 + thread reader"
timeout 23 "${FREE_SET[@]}" python benchmarks/bench_trailing.py --variants "$rows" \
  --batches 50 --rounds 9 --budget-s 16 --compact --json "$OUT/g-free.json" 2>&1 | tail -n 14
echo "=== unpinned: rc=${PIPESTATUS[0]} at $((SECONDS - t0)) s"
