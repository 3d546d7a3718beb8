"""``benchmarks/bench_dashboard_windows.py``: the tab toggled in windows of one training run.

Figures are not asserted (timing claims belong to ``benchmarks/``). Checked here: the ABBA
schedule, which batches a window counts, that a block's ratio cancels a linear drift (on
fixed numbers), and, in real headless Chromium (marked ``slow``: two short runs, about 25 s),
that a tiny run reports every window with batches in it and a ratio per block, for the
open/closed run and the A/A control. Like ``tests/test_dashboard_browser.py``, the browser
test FAILS (does not skip) without Chromium and Playwright, saying what to install.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
SCRIPT = BENCH / "bench_dashboard_windows.py"
CHROMIUM = os.environ.get("TRAINBUS_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCH))
    try:
        import bench_dashboard_windows

        yield bench_dashboard_windows
    finally:
        sys.path.remove(str(BENCH))


def test_windows_come_in_abba_blocks_that_alternate_their_first_kind(bench: ModuleType) -> None:
    kinds = bench.schedule(12)
    assert kinds == ["open", "closed", "closed", "open", "closed", "open", "open", "closed",
                     "open", "closed", "closed", "open"]
    assert kinds.count("open") == kinds.count("closed") == 6


def test_a_window_counts_the_batches_that_start_and_end_inside_it(bench: ModuleType) -> None:
    clock = bench.BatchClock(16)
    ends = [1.0, 1.5, 2.0, 2.5, 3.0, 3.5]  # batch i ends at ends[i], began at ends[i - 1]
    cpus = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    for i, (t, c) in enumerate(zip(ends, cpus, strict=True)):
        clock.wall[i], clock.cpu[i] = t, c
    clock.n = len(ends)

    def mark(t: float, runq: float) -> dict[str, float]:
        return {"t": t, "ran": 0.0, "runq": runq, "chromium": 0.0}

    # [1.2, 3.2]: the batches (1.5, 2.0], (2.0, 2.5], (2.5, 3.0]; (1.0, 1.5] began before
    got = bench.span(clock, mark(1.2, 0.0), mark(3.2, 0.5))
    assert got["batches"] == 3
    assert got["wall"] == pytest.approx(500.0)  # ms per batch
    assert got["cpu"] == pytest.approx(100.0)
    assert got["runq"] == pytest.approx(0.25)  # 0.5 s of 2 s waiting for a core
    assert got["own"] == pytest.approx(375.0)
    empty = bench.span(clock, mark(1.6, 0.0), mark(1.9, 0.0))
    assert empty["batches"] == 0 and math.isnan(empty["wall"])


def test_a_block_ratio_cancels_a_linear_drift(bench: ModuleType) -> None:
    kinds = bench.schedule(8)
    windows: list[dict[str, Any]] = []
    for i, kind in enumerate(kinds):
        ms = (2.0 + 0.1 * i) * (1.05 if kind == "open" else 1.0)  # the machine slows down
        figures = {"wall": ms, "own": ms, "cpu": ms, "batches": 100}
        windows.append({"kind": kind, "settled": figures, "all": figures})
    got = bench.blocks(windows)
    assert len(got) == 2
    for block in got:
        for part in ("settled", "all"):
            assert block[part]["wall"] == pytest.approx(1.05)


@pytest.mark.slow
def test_a_tiny_run_reports_every_window_and_a_ratio_per_block(tmp_path: Path) -> None:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"this test needs Chromium at {CHROMIUM}: `apt-get install -y chromium` "
                    "(Debian), or set TRAINBUS_CHROMIUM to a Chromium binary")
    pytest.importorskip("psutil")
    try:
        import playwright  # noqa: F401
    except ImportError:
        pytest.fail("this test needs Playwright: pip install -e '.[test]'")
    out = tmp_path / "windows.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--windows", "4", "--window", "0.8", "--settle", "0.3",
         "--warmup", "0", "--json", str(out)],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True, text=True, timeout=240, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    runs = json.loads(out.read_text())["runs"]
    assert [run["control"] for run in runs] == [False, True]
    for run in runs:
        assert [w["kind"] for w in run["windows"]] == ["open", "closed", "closed", "open"]
        for window in run["windows"]:
            for part in ("settled", "all"):
                assert window[part]["batches"] > 0, window
                assert window[part]["wall"] > 0 and window[part]["cpu"] > 0
            assert window["all"]["batches"] >= window["settled"]["batches"]
            assert window["settled_s"] >= 0.3
        assert len(run["blocks"]) == 1
        assert run["published"] > 0 and run["batches"] > 0
        for part in ("settled", "all"):
            assert all(r > 0 for r in run["blocks"][0][part].values())
    opened = [w for w in runs[0]["windows"] if w["kind"] == "open"]
    assert all(w["live_s"] >= w["load_s"] > 0 for w in opened)  # the page went live
    assert "| open/closed, wall, settled | 1 |" in done.stdout
    assert "| A/A control, wall, settled | 1 |" in done.stdout
