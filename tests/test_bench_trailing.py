"""``benchmarks/bench_trailing.py`` (scenario (g)) runs, and its rows compare like with like.

Its figures are printed, not asserted (timing claims belong to ``benchmarks/``); what is
asserted is what makes the rows comparable: every row trains with the same number of torch
threads on the training thread, every upload row sends one request per batch on one
kept-alive connection to the server process, whose CPU time is charged to the run. The
headline rows are the issue's scenario exactly (the upload and a ``@blocking`` weight reader,
which sees the weights of its batch in every row, checked against the plain loop's); the
rows that add a plain lockstep reader on its own thread are separate, and that reader stays
in step with its batch in every one of them but ``max_lag=2 + thread reader``.

Marked ``slow`` (22 short training runs in a subprocess: about 15 s on a quiet machine).
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
    headline = {"plain loop", "no upload", "sleep, trailing(2)", "lockstep", "trailing(2)",
                "tuned httpx, trailing(2)", "raw client, trailing(2)", "max_lag=2"}
    with_reader = {"no upload + thread reader", "trailing(2) + thread reader",
                   "max_lag=2 + thread reader"}
    assert set(runs) == headline | with_reader
    for variant, (run,) in runs.items():
        if variant == "plain loop":
            continue
        assert run["torch_threads"] == 1, variant
        assert run["truth_mismatches"] == 0, variant  # the @blocking reader: its batch
        assert ("thread_reader_mismatches" in run) == (variant in with_reader), variant
        posts = "upload" not in variant and "sleep" not in variant
        assert run["requests"] == (BATCHES if posts else 0), variant
        assert run["connections"] == (1 if posts else 0), variant
        if posts:
            assert run["server_cpu"] > 0, variant
        if variant in with_reader:
            assert not run["reader_on_training_thread"], variant
            if variant != "max_lag=2 + thread reader":
                assert run["thread_reader_mismatches"] == 0, variant
    summary = result["summary"]
    assert summary["trailing(2)"]["base"] == "no upload"
    assert summary["trailing(2) + thread reader"]["base"] == "no upload + thread reader"


@pytest.mark.slow
def test_the_headline_rows_alone(tmp_path: Path) -> None:
    """``--variants headline``: the issue's scenario only, no thread reader anywhere."""
    out = tmp_path / "g.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rounds", "1", "--batches", str(BATCHES),
         "--hidden", "64", "--variants", "headline", "--json", str(out)],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    runs = json.loads(out.read_text())["runs"]
    assert "no upload + thread reader" not in runs and "trailing(2)" in runs
    assert all("thread_reader_mismatches" not in run for run, in runs.values())


def test_unknown_variants_are_refused_by_name() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--variants", "trailing(3)", "--hidden", "64"],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 2
    assert "--variants: unknown ['trailing(3)']" in done.stderr


def test_variant_names_hold_commas_and_bring_their_baselines() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import bench_trailing
    finally:
        sys.path.remove(str(SCRIPT.parent))
    chosen = bench_trailing.choose("tuned httpx, trailing(2); trailing(2) + thread reader")
    assert chosen == ["no upload", "tuned httpx, trailing(2)", "no upload + thread reader",
                      "trailing(2) + thread reader"]
    assert bench_trailing.choose("headline") == bench_trailing.HEADLINE


def test_the_device_script_names_rows_that_exist() -> None:
    """``scripts/device_trailing.sh`` runs on a lent machine, once: a wrong row name there
    would waste the run, so its rows are checked here."""
    script = ROOT / "scripts" / "device_trailing.sh"
    rows = subprocess.run(
        ["bash", "-c", f'eval "$(grep ^rows= {script})"; printf %s "$rows"'],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout
    assert "thread reader" in rows
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import bench_trailing
    finally:
        sys.path.remove(str(SCRIPT.parent))
    assert "trailing(2) + thread reader" in bench_trailing.choose(rows)
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
