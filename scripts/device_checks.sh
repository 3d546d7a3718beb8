#!/usr/bin/env bash
# The checks that need the GPU machine (or a quiet one), as one run: the CUDA sync check and
# step timings (gpu_check.py), the distributed checks on one GPU (gpu_check.py --ddp),
# scenario (g) (bench_trailing.py) on a quiet machine, and the bus before/after on two pinned
# cores: scripts/device_bus.sh.
# Each step has its own timeout so one hang does not take the others' time.
# Usage (repo root):  bash scripts/device_checks.sh   (writes to $OUT, else ./device-out)
set -u
OUT="${OUT:-device-out}"; mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
step() { local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit}s): $*"; local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1; local rc=$?
  tail -n 40 "$OUT/$name.txt"; echo "=== $name: rc=$rc in $((SECONDS - t0)) s"; }
nvidia-smi -L; nproc; python -c "import torch, anyio, httpx; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
step gpu_check 110 python scripts/gpu_check.py --steps 100 --rounds 2
step ddp 200 python scripts/gpu_check.py --ddp
step trailing 110 python benchmarks/bench_trailing.py --rounds 9 --budget-s 80 --json "$OUT/g.json"
