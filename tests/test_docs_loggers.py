"""The ```python examples of docs/loggers.md run.

The blocks before the first ``## `` heading are the shared setup; each ``## `` section is
one test case that runs the setup and then its own blocks, in order, in one namespace,
in a fresh working folder. Fence an example as ```text (or anything but ``python``) when
it is not meant to run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "loggers.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _sections() -> tuple[list[str], dict[str, list[str]]]:
    parts = re.split(r"^## (.+)$", DOC.read_text(encoding="utf-8"), flags=re.MULTILINE)
    setup = BLOCK.findall(parts[0])
    sections = {
        title.strip(): BLOCK.findall(body)
        for title, body in zip(parts[1::2], parts[2::2], strict=True)
    }
    return setup, {title: blocks for title, blocks in sections.items() if blocks}


SETUP, SECTIONS = _sections()


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
    for i, code in enumerate([*SETUP, *SECTIONS[title]]):
        exec(compile(code, f"{DOC.name}[{title} #{i}]", "exec"), namespace)
    if title == "ConsoleLogger":
        lines = capsys.readouterr().out.splitlines()
        assert [line.split("]")[0] for line in lines] == ["[epoch 1 batch 2", "[epoch 1 batch 4"]
