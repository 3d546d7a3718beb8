"""``benchmarks/bench_mlflow_windows.py``: logging toggled in ABBA windows within one fit.

Timings are not asserted (they belong to ``benchmarks/``). What is asserted: the schedule
(warm-up, then blocks of A1 B1 B2 A2 alternating logging / control, on only in the A
windows of logging blocks); the arithmetic (a linear drift cancels in the per-block
difference, a constant cost per on batch is recovered exactly, the dropped batches are the
first ``drop`` of each window); and a tiny run against the stub server, where every point
logged in an on window arrives and the report has its rows.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def windows() -> Iterator[ModuleType]:
    """The script, imported from benchmarks/ (which it puts on ``sys.path`` itself)."""
    saved = list(sys.path)
    sys.path.insert(0, str(BENCH))
    try:
        import bench_mlflow_windows

        yield bench_mlflow_windows
    finally:
        sys.path[:] = saved


def test_the_schedule_is_warmup_then_abba_blocks_alternating_logging_and_control(
    windows: ModuleType,
) -> None:
    on, wins = windows.schedule(warmup=7, blocks=3, window=5)
    assert len(on) == 7 + 3 * 4 * 5
    assert list(on[:7]) == [1] * 7
    assert [(w["block"], w["kind"], w["label"], w["start"]) for w in wins[:5]] == [
        (0, "logging", "A1", 7), (0, "logging", "B1", 12), (0, "logging", "B2", 17),
        (0, "logging", "A2", 22), (1, "control", "A1", 27)]
    for w in wins:
        logs = w["kind"] == "logging" and w["label"] in ("A1", "A2")
        assert w["on"] is logs
        assert list(on[w["start"]:w["start"] + 5]) == [int(logs)] * 5


def test_a_linear_drift_cancels_and_a_cost_per_on_batch_is_recovered(
    windows: ModuleType,
) -> None:
    on, wins = windows.schedule(warmup=4, blocks=4, window=10)
    # batch i takes 1 ms + a drift of 0.001 ms per batch, + 0.25 ms when it logs
    t, marks = 0.0, []
    for i, logs in enumerate(on):
        t += (1.0 + 0.001 * i + 0.25 * logs) / 1e3
        marks.append(t)
    rows = windows.per_window({"wall": marks, "cpu": marks, "proc": marks}, wins, 10, 3)
    assert rows[0]["wall"] == pytest.approx(
        (marks[wins[0]["start"] + 9] - marks[wins[0]["start"] + 2]) * 1e3 / 7)  # drop 3
    assert rows[0]["wall_all"] == pytest.approx(
        (marks[wins[0]["start"] + 9] - marks[wins[0]["start"] - 1]) * 1e3 / 10)
    for key in ("wall", "wall_all", "cpu_all"):
        assert windows.differences(rows, "logging", key) == pytest.approx([0.25, 0.25])
        assert windows.differences(rows, "control", key) == pytest.approx([0.0, 0.0])
    assert windows.spills(rows, "control", "wall_all") == pytest.approx([-0.01, -0.01])


def test_a_tiny_run_against_the_stub_delivers_every_point(
    windows: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "windows.json"
    windows.main(["--variants", "null,stub", "--blocks", "2", "--window", "12", "--drop", "3",
                  "--warmup", "20", "--json", str(out)])
    result = json.loads(out.read_text())["variants"]
    assert set(result) == {"null", "stub"}
    stub = result["stub"]
    assert stub["points_expected"] == (20 + 2 * 12) * 10  # warm-up + A1, A2 of block 0
    assert stub["points_delivered"] == stub["points_expected"]
    assert stub["requests"] >= 1
    assert [(w["kind"], w["label"]) for w in stub["windows"]] == [
        ("logging", "A1"), ("logging", "B1"), ("logging", "B2"), ("logging", "A2"),
        ("control", "A1"), ("control", "B1"), ("control", "B2"), ("control", "A2")]
    summary = {(r["kind"], r["key"]): r for r in stub["summary"]}
    assert set(summary) == {(kind, key) for kind in ("logging", "control") for key in (
        "wall", "wall_all", "cpu", "cpu_all", "proc", "proc_all", "spill")}
    assert all(len(r["diffs"]) == 1 and r["interval"] is None for r in summary.values())
    printed = capsys.readouterr().out
    assert "| stub | logging (1) | wall (drop 3) |" in printed
    assert "| null | control (1) | wall (all) |" in printed
    assert "too few rounds" in printed


def test_bad_arguments_name_the_option(windows: ModuleType,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        windows.main(["--variants", "stub,cloud"])
    assert "--variants: unknown ['cloud']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        windows.main(["--window", "10", "--drop", "10"])
    assert "--drop must be between 1 and --window - 1 (9)" in capsys.readouterr().err
