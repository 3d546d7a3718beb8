"""A fit shows progress and ends with its time account unless ``progress=False`` or
``TRAINBUS_PROGRESS=0`` (SPEC section 4; ``training/output.py``). The suite sets the
variable to 0 (tests/conftest.py); these tests unset it."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import make_trainer
from trainbus.callbacks import ProgressBar
from trainbus.training.account import TimeMetrics

HEAD = "where the time went"


@pytest.fixture
def default_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINBUS_PROGRESS", raising=False)


def _bars(trainer: object) -> list[object]:
    return [cb for cb in trainer.state.callbacks if isinstance(cb, ProgressBar)]  # type: ignore[attr-defined]


@pytest.mark.usefixtures("default_env")
def test_a_bare_fit_shows_progress_lines_and_the_account(
    capsys: pytest.CaptureFixture[str],
) -> None:
    trainer = make_trainer(3, epochs=2)
    assert len(_bars(trainer)) == 1
    trainer.fit_sync()
    err = capsys.readouterr().err
    # Not a terminal: one line per epoch (and per 100 batches), then the table.
    assert "epoch 1/2 done  batch 3" in err and "epoch 2/2 done  batch 6" in err
    assert HEAD + " (6 batches" in err
    for part in ("startup", "data", "compute", "bus", "close"):
        assert f"\n  {part} " in err
    assert err.index("epoch 2/2 done") < err.index(HEAD)


@pytest.mark.usefixtures("default_env")
def test_a_progress_bar_of_the_users_is_the_only_one_and_gets_the_table() -> None:
    stream = io.StringIO()
    mine = ProgressBar(bar="plain", stream=stream, interval="1ep")
    trainer = make_trainer(2, callbacks=[mine])
    assert _bars(trainer) == [mine]
    trainer.fit_sync()
    assert HEAD in stream.getvalue()


@pytest.mark.usefixtures("default_env")
def test_progress_false_shows_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    trainer = make_trainer(2, progress=False)
    assert not _bars(trainer)
    assert not any(isinstance(cb, TimeMetrics) for cb in trainer.state.callbacks)
    trainer.fit_sync()
    assert capsys.readouterr().err == ""
    assert trainer.time_account is not None  # the account is kept, only not shown


@pytest.mark.parametrize("value", ["0", "false", "OFF"])
def test_the_environment_turns_it_off(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINBUS_PROGRESS", value)
    trainer = make_trainer(2)
    assert not _bars(trainer)
    trainer.fit_sync()
    assert capsys.readouterr().err == ""


def test_progress_true_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINBUS_PROGRESS", "0")
    assert len(_bars(make_trainer(2, progress=True))) == 1


def test_bad_values_name_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TypeError, match=r"progress=.*True, False or None"):
        make_trainer(2, progress="yes")
    monkeypatch.setenv("TRAINBUS_PROGRESS", "maybe")
    with pytest.raises(ValueError, match=r"TRAINBUS_PROGRESS='maybe'.*set it to 0"):
        make_trainer(2)


@pytest.mark.slow  # a Python process importing torch: seconds
def test_a_script_prints_the_account_to_stderr_and_nothing_to_stdout(tmp_path: Path) -> None:
    script = tmp_path / "fit.py"
    script.write_text(
        "from tests.helpers import make_trainer\n"
        "make_trainer(3).fit_sync()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRAINBUS_PROGRESS"}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120,
        cwd=root,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert "epoch 1/1 done  batch 3" in done.stderr and HEAD in done.stderr
