"""``benchmarks/bench_mlflow_windows.py``: logging toggled in ABBA windows within one fit.

Timings are not asserted (they belong to ``benchmarks/``). What is asserted: the schedule
(warm-up, then blocks of A1 B1 B2 A2, on only in the A windows of the logging fit, nowhere
in the A/A control fit); the arithmetic (a linear drift cancels in the per-block
difference, a constant cost per on batch is recovered exactly, the dropped batches are the
first ``drop`` of each window); and a tiny run against the stub server, where every point
logged arrives and the report has its rows.
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


def test_the_schedule_is_warmup_then_abba_or_baab_blocks_logging_only_in_a_windows(
    windows: ModuleType,
) -> None:
    on, wins = windows.schedule(warmup=7, blocks=40, window=5, logging=True, seed=3)
    assert len(on) == 7 + 40 * 4 * 5
    assert list(on[:7]) == [1] * 7
    assert [w["start"] for w in wins] == list(range(7, len(on), 5))
    orders = []
    for block in range(40):
        mine = [w for w in wins if w["block"] == block]
        order = "".join(w["label"][0] for w in mine)
        assert order in ("ABBA", "BAAB")
        assert [w["label"][1] for w in mine if w["label"][0] == "A"] == ["1", "2"]
        assert all(w["order"] == order for w in mine)
        orders.append(order)
    assert 10 < orders.count("ABBA") < 30  # drawn, not alternating
    assert orders == [o for o in (w["order"] for w in windows.schedule(
        7, 40, 5, logging=True, seed=3)[1][::4])]  # the seed fixes them
    for w in wins:
        assert w["on"] is (w["label"][0] == "A")
        assert list(on[w["start"]:w["start"] + 5]) == [int(w["on"])] * 5
    control, same = windows.schedule(warmup=7, blocks=40, window=5, logging=False, seed=3)
    assert list(control) == [1] * 7 + [0] * 800  # A/A: logs only in the warm-up
    assert [(w["start"], w["label"]) for w in same] == [(w["start"], w["label"]) for w in wins]


def test_a_linear_drift_cancels_and_a_cost_per_on_batch_is_recovered(
    windows: ModuleType,
) -> None:
    # batch i takes 1 ms + a drift of 0.001 ms per batch, + 0.25 ms when it logs
    for logging, cost in ((True, 0.25), (False, 0.0)):
        on, wins = windows.schedule(warmup=4, blocks=12, window=10, logging=logging)
        t, marks = 0.0, []
        for i, logs in enumerate(on):
            t += (1.0 + 0.001 * i + 0.25 * logs) / 1e3
            marks.append(t)
        rows = windows.per_window({"wall": marks, "cpu": marks, "proc": marks}, wins, 10, 3)
        first = wins[0]["start"]
        assert rows[0]["wall"] == pytest.approx((marks[first + 9] - marks[first + 2]) * 1e3 / 7)
        assert rows[0]["wall_all"] == pytest.approx(
            (marks[first + 9] - marks[first - 1]) * 1e3 / 10)
        abba = len({w["block"] for w in wins if w["order"] == "ABBA"})
        assert 0 < abba < 12
        for key in ("wall", "wall_all", "cpu_all"):
            blocks = windows.per_block(rows, key)
            assert blocks["on - off"] == pytest.approx([cost] * 12)  # the drift cancels
            assert blocks["spill"] == pytest.approx([-0.01] * abba)  # B1 - B2: the drift
            assert blocks["with spill"] == pytest.approx([cost - 0.01] * abba)


def test_work_left_after_the_on_windows_counts_in_with_spill(windows: ModuleType) -> None:
    # every on window costs 0.2 ms per batch in it, and leaves 1 ms in the next window
    on, wins = windows.schedule(warmup=4, blocks=30, window=10, logging=True, seed=1)
    durations = [1.0 + 0.2 * logs for logs in on]
    for w in wins:
        follows_on = w["start"] > 4 and on[w["start"] - 1]
        if follows_on and not w["on"]:
            durations[w["start"]] += 1.0
    marks = [sum(durations[: i + 1]) / 1e3 for i in range(len(durations))]
    rows = windows.per_window({"wall": marks, "cpu": marks, "proc": marks}, wins, 10, 3)
    blocks = windows.per_block(rows, "wall_all")
    # ABBA: the two on windows leave 1 ms in B1: 0.2 + 1 / 20 per on batch
    assert blocks["with spill"] == pytest.approx([0.25] * len(blocks["spill"]))
    assert blocks["spill"] == pytest.approx([0.1] * len(blocks["spill"]))
    assert windows.per_block(rows, "wall")["spill"] == pytest.approx(  # dropped: not seen
        [0.0] * len(blocks["spill"]))


def test_a_tiny_run_against_the_stub_delivers_every_point(
    windows: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "windows.json"
    windows.main(["--variants", "nobody,null,stub", "--blocks", "2", "--window", "12",
                  "--drop", "3", "--warmup", "20", "--json", str(out)])
    result = json.loads(out.read_text())["variants"]
    assert set(result) == {"nobody", "null", "stub"}
    assert all(set(fits) == {"logging", "control"} for fits in result.values())
    logging, control = result["stub"]["logging"], result["stub"]["control"]
    assert logging["points_expected"] == (20 + 2 * 2 * 12) * 10  # warm-up + the A windows
    assert control["points_expected"] == 20 * 10  # the warm-up only
    for fit in (logging, control):
        assert fit["points_delivered"] == fit["points_expected"]
        assert fit["requests"] >= 1
        assert sorted((w["block"], w["label"]) for w in fit["windows"]) == [
            (b, label) for b in (0, 1) for label in ("A1", "A2", "B1", "B2")]
        abba = len({w["block"] for w in fit["windows"] if w["order"] == "ABBA"})
        assert [(r["key"], r["figure"], len(r["diffs"])) for r in fit["summary"]] == [
            (key, figure, 2 if figure == "on - off" else abba)
            for key, figure in windows.FIGURES]
        assert all(r["interval"] is None for r in fit["summary"])
    printed = capsys.readouterr().out
    assert "| stub, logging (2) | on - off | wall (drop 3) |" in printed
    assert "| null, control (2) | on - off | wall (all) |" in printed
    assert "too few rounds" in printed


def test_bad_arguments_name_the_option(windows: ModuleType,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        windows.main(["--variants", "stub,cloud"])
    assert "--variants: unknown ['cloud']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        windows.main(["--window", "10", "--drop", "10"])
    assert "--drop must be between 1 and --window - 1 (9)" in capsys.readouterr().err


def test_the_median_interval_and_the_verdict_on_fixed_numbers() -> None:
    saved = list(sys.path)
    sys.path.insert(0, str(BENCH))
    try:
        import paired_stats as ps
    finally:
        sys.path[:] = saved
    assert ps.median_interval([0.3, 0.1, 0.2, 0.5, 0.4]) is None  # under 6: no 95% interval
    assert ps.median_interval([6.0, 1.0, 5.0, 2.0, 4.0, 3.0]) == (1.0, 6.0)  # 1 - 2/64 >= 95%
    assert ps.median_interval([float(x) for x in range(20)]) == (5.0, 14.0)  # 6th and 15th
    assert ps.verdict((0.02, 0.1), 0.1) == "shown"
    assert ps.verdict((0.1001, 0.3), 0.1) == "refuted"
    assert ps.verdict((0.05, 0.15), 0.1) == "not decided"
    assert ps.verdict(None, 0.1) == "too few rounds"
    assert ps.spread([1.0, 2.0, 3.0, 4.0, 5.0], ".1f") == "1.0 | 2.0 | 3.0 | 4.0 | 5.0"
