#!/usr/bin/env bash
# The bus's timing figures on two quiet pinned cores of the device machine (SPEC section 7 is
# about a 2-core machine): compare_bus.py (this tree against .devcarry/base/src) and
# compare_handler_calls.py (trainbus's handler kinds against Ignite, from the wheel in .whl).
set -u
OUT="${OUT:-device-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
step() { local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit}s): $*"; local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1; local rc=$?
  tail -n 25 "$OUT/$name.txt"; echo "=== $name: rc=$rc in $((SECONDS - t0)) s"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD/src:/tmp/site"
step compare_bus 150 taskset -c 0,1 python benchmarks/compare_bus.py --before .devcarry/base/src --rounds 3
step handler_calls 200 taskset -c 2,3 python benchmarks/peers/compare_handler_calls.py --rounds 4 --reps 3 --ignite-python "$(command -v python)"
