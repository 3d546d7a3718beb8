"""``trainbus demo``: the main job runs end to end and writes its metrics file."""

from __future__ import annotations

import json
import re
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from trainbus.__main__ import main

SUMMARY = re.compile(
    r"(\d+\.\d\d) s of callback work, (\d+\.\d\d) s of it hidden behind training \((\d+)%\)"
)


def test_demo_trains_reports_and_writes_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--epochs", "1", "--out", str(tmp_path), "--seed", "0"]) == 0
    out = capsys.readouterr().out

    accuracy = re.search(r"held-out accuracy: (\d+\.\d\d)% on 450 digits", out)
    assert accuracy, out
    assert float(accuracy[1]) > 80.0  # one epoch of a real MLP on digits
    match = SUMMARY.search(out)
    assert match, out
    work, hidden, percent = float(match[1]), float(match[2]), int(match[3])
    assert 0.0 <= hidden <= work
    assert 0 <= percent <= 100
    assert re.search(r"uploaded (\d+) points in (\d+) requests", out)

    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    points = [json.loads(line) for line in lines]
    by_name: dict[str, list[dict[str, object]]] = {}
    for point in points:
        by_name.setdefault(str(point["name"]), []).append(point)
    steps_per_epoch = 43  # 1,347 training digits in batches of 32
    assert [p["step"] for p in by_name["loss/train"]] == list(range(1, steps_per_epoch + 1))
    (eval_acc,) = by_name["eval/accuracy"]
    assert f"{float(eval_acc['value']):.2%}" == f"{accuracy[1]}%"  # type: ignore[arg-type]
    assert "eval/loss" in by_name

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["epochs"] == 1
    assert summary["points_uploaded"] == len(points)  # the uploader lost nothing
    assert summary["accuracy"] == pytest.approx(float(eval_acc["value"]))  # type: ignore[arg-type]


def test_demo_without_scikit_learn_names_the_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "sklearn", None)  # import sklearn now fails
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    assert main(["demo", "--epochs", "1", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "pip install 'trainbus[demo]'" in err


@pytest.mark.parametrize(
    "argv", [["demo", "--epochs", "0"], ["demo", "--upload-latency-ms", "-5"], ["demo", "-x"]]
)
def test_demo_bad_arguments_exit_with_usage(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "usage: trainbus" in capsys.readouterr().err


def test_no_command_prints_help_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0  # as `git` does: the help, not an error
    assert "demo" in capsys.readouterr().out


def test_console_script_points_at_main() -> None:
    (script,) = entry_points(group="console_scripts", name="trainbus")
    assert script.load() is main
