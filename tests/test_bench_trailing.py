"""``benchmarks/bench_trailing.py`` (scenario (g)) runs, and its rows compare like with like.

Its figures are printed, not asserted (timing claims belong to ``benchmarks/``); what is
asserted is what makes the rows comparable: every row trains with the same number of torch
threads on the training thread, every upload row sends one request per batch on one
kept-alive connection to the server process, whose CPU time is charged to the run, and the
thread reader stays in step with its batch in every row but ``max_lag=2``.

Marked ``slow`` (14 short training runs in a subprocess: about 10 s on a quiet machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_trailing.py"
BATCHES = 4


@pytest.mark.slow
def test_the_benchmark_runs_and_its_rows_are_comparable(tmp_path: Path) -> None:
    out = tmp_path / "g.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rounds", "1", "--batches", str(BATCHES),
         "--hidden", "64", "--threads", "1", "--json", str(out)],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "training thread CPU" in done.stdout and "loop thread CPU" in done.stdout
    result = json.loads(out.read_text())
    runs = result["runs"]
    assert set(runs) == {"plain loop", "no upload", "sleep, trailing(2)", "lockstep",
                         "trailing(2)", "raw client, trailing(2)", "max_lag=2"}
    for variant, (run,) in runs.items():
        if variant == "plain loop":
            continue
        assert run["torch_threads"] == 1, variant
        assert not run["reader_on_training_thread"], variant
        posts = variant in ("lockstep", "trailing(2)", "raw client, trailing(2)", "max_lag=2")
        assert run["requests"] == (BATCHES if posts else 0), variant
        assert run["connections"] == (1 if posts else 0), variant
        if posts:
            assert run["server_cpu"] > 0, variant
        if variant != "max_lag=2":
            assert run["thread_reader_mismatches"] == 0, variant
