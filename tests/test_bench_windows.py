"""``benchmarks/windows.py`` (paired ABBA windows in one run) and the scenario (g) script
that uses it, ``benchmarks/bench_trailing_windows.py``.

The pairing's arithmetic is checked on made-up series: a constant cost is found exactly, a
linear drift of the machine cancels, and the settling batches are left out. The script is
run tiny (structure, not timings: timing claims belong to ``benchmarks/``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import paired_stats  # noqa: E402
import windows  # noqa: E402


def series(width: int, blocks: int, cost: float, drift: float = 0.0,
           settle_extra: float = 0.0) -> list[float]:
    out = []
    for i in range(width * 4 * blocks):
        value = 10.0 + drift * i + (cost if windows.is_on(i, width) else 0.0)
        if i % width == 0:
            value += settle_extra  # the first batch of each window carries the last one's tail
        out.append(value)
    return out


def test_windows_are_abba_blocks_or_baab_ones_drawn_at_random() -> None:
    assert [windows.is_on(i, 2) for i in range(10)] == [
        True, True, False, False, False, False, True, True, True, True]
    on = windows.schedule(40, seed=3)
    blocks = {tuple(on[i:i + 4]) for i in range(0, 160, 4)}
    assert blocks == {windows.ABBA, windows.BAAB}  # both kinds, nothing else
    assert on == windows.schedule(40, seed=3)  # reproducible
    assert windows.schedule(2) == list(windows.ABBA) * 2
    assert [windows.is_on(i, 3, on) for i in range(12)] == [f for f in on[:4] for _ in range(3)]


def test_a_constant_cost_is_found_in_baab_blocks_too() -> None:
    on = windows.schedule(10, seed=1)
    data = [10.0 + (0.25 if on[i // 4] else 0.0) + 0.02 * i for i in range(4 * 40)]
    diffs = windows.block_differences(windows.window_means(data, 4, 0), on)
    assert diffs == pytest.approx([0.25] * 10)


def test_a_constant_cost_is_found_and_a_linear_drift_cancels() -> None:
    data = series(width=5, blocks=8, cost=0.3, drift=0.01)
    diffs = windows.block_differences(windows.window_means(data, 5, 0))
    assert len(diffs) == 8
    assert diffs == pytest.approx([0.3] * 8)


def test_settling_batches_are_left_out() -> None:
    data = series(width=5, blocks=6, cost=0.0, settle_extra=7.0)
    with_settle = windows.block_differences(windows.window_means(data, 5, 1))
    assert with_settle == pytest.approx([0.0] * 6)
    with pytest.raises(ValueError, match="settle must be in"):
        windows.window_means(data, 5, 5)


def test_the_interval_of_the_median_and_the_verdict() -> None:
    assert paired_stats.median_interval([0.1] * 5) is None  # too few for 95%
    xs = [float(i) for i in range(1, 21)]
    low, high = paired_stats.median_interval(xs)  # type: ignore[misc]
    assert low < 10.5 < high and (low, high) == (6.0, 15.0)
    assert paired_stats.verdict((0.1, 0.4), 0.5) == "shown"
    assert paired_stats.verdict((0.6, 0.9), 0.5) == "refuted"
    assert paired_stats.verdict((0.1, 0.9), 0.5) == "not decided"
    assert paired_stats.verdict(None, 0.5, "blocks") == "too few blocks"
    with pytest.raises(ValueError, match="no whole ABBA block"):
        windows.summarize([])


@pytest.mark.slow
def test_the_windowed_scenario_g_runs(tmp_path: Path) -> None:
    out = tmp_path / "g.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_trailing_windows.py"),
         "--blocks", "2", "--width", "6", "--settle", "2", "--runs", "1", "--hidden", "64",
         "--json", str(out)],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    runs = result["runs"]
    assert [r["control"] for r in runs] == [False, True]
    upload = runs[0]
    # 2 blocks x 4 windows x 6 batches, measured from the second batch on
    assert len(upload["wall"]) == len(upload["cpu"]) == 48
    # the upload runs only in "on" windows (half of them), never in the control run
    assert upload["sent"] == 24 and runs[1]["sent"] == 0
    assert all(r["truth_mismatches"] == 0 for r in runs)
    assert result["summary"]["upload wall settle=2"]["n"] == 2
    assert result["verdict"] == "too few blocks"
    assert "| on - off, per batch" in done.stdout and result["text"] in done.stdout
