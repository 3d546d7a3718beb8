"""The ```python examples of docs/loggers.md run.

The blocks before the first ``## `` heading are the shared setup; each ``## `` section is
one test case that runs the setup and then its own blocks, in order, in one namespace,
in a fresh working folder. Fence an example as ```text (or anything but ``python``) when
it is not meant to run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs_pages import Page

PAGE = Page.read("loggers.md")
DOC = PAGE.path
SETUP, SECTIONS = PAGE.setup, PAGE.sections


def test_the_page_has_examples() -> None:
    assert SETUP
    assert {"ConsoleLogger", "JSONLinesLogger", "TensorBoardLogger", "MLflowLogger"} <= set(
        SECTIONS
    )


@pytest.mark.parametrize("title", sorted(SECTIONS))
def test_section_examples_run(
    title: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest,
) -> None:
    monkeypatch.chdir(tmp_path)
    if title == "MLflowLogger":  # the page's example talks to a real server, as users do
        server = request.getfixturevalue("mlflow_server")
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
    namespace: dict[str, object] = {"__name__": f"docs_loggers_{title}"}
    PAGE.run(title, namespace)
    if title == "ConsoleLogger":
        lines = capsys.readouterr().out.splitlines()
        assert [line.split("]")[0] for line in lines] == ["[epoch 1 batch 2", "[epoch 1 batch 4"]
