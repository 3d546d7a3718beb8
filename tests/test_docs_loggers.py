"""The ```python examples of docs/loggers.md run as a reader runs them.

Every block, top to bottom, in one namespace and one working folder (``Page.run_all``); the
blocks before the first ``## `` heading are the shared setup. The MLflow example talks to a
real ``mlflow server`` (the ``mlflow_server`` fixture), as users do. Fence an example as
```text (or anything but ``python``) when it is not meant to run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs_pages import Page
from tests.loggers.wandb_files import offline_env

PAGE = Page.read("loggers.md")
DOC = PAGE.path
SETUP, SECTIONS = PAGE.setup, PAGE.sections


def test_the_page_has_examples() -> None:
    assert SETUP
    assert {
        "ConsoleLogger", "JSONLinesLogger", "TensorBoardLogger", "MLflowLogger", "WandBLogger"
    } <= set(SECTIONS)


def test_the_page_runs_top_to_bottom_in_one_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest,
) -> None:
    monkeypatch.chdir(tmp_path)
    server = request.getfixturevalue("mlflow_server")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
    for key, value in offline_env(tmp_path / "wandb-home").items():
        monkeypatch.setenv(key, value)  # the W&B example stays on this machine
    try:
        printed = PAGE.run_all_printing(capsys)
    finally:
        import wandb

        wandb.teardown()
    lines = printed["ConsoleLogger"].splitlines()
    assert [line.split("]")[0] for line in lines] == ["[epoch 1 batch 2", "[epoch 1 batch 4"]
