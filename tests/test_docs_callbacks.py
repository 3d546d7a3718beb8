"""The ```python examples of docs/callbacks.md run.

The blocks before the first ``## `` heading are the shared setup; each ``## `` section is
one test case that runs the setup and then its own blocks, in order, in one namespace,
in a fresh working folder. Fence an example as ```text when it is not meant to run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import trainbus.callbacks

DOC = Path(__file__).resolve().parents[1] / "docs" / "callbacks.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
DOCUMENTED = {
    "EarlyStopper", "GradMonitor", "LRMonitor", "MemoryMonitor", "ProgressBar",
    "SpeedMonitor", "ThresholdStopper",
}  # fmt: skip


def _sections() -> tuple[list[str], dict[str, list[str]]]:
    parts = re.split(r"^## (.+)$", DOC.read_text(encoding="utf-8"), flags=re.MULTILINE)
    setup = BLOCK.findall(parts[0])
    sections = {
        title.strip(): BLOCK.findall(body)
        for title, body in zip(parts[1::2], parts[2::2], strict=True)
    }
    return setup, sections


SETUP, SECTIONS = _sections()


def test_every_callback_has_a_section_with_an_example() -> None:
    assert SETUP
    assert set(trainbus.callbacks.__all__) >= DOCUMENTED
    assert {title for title, blocks in SECTIONS.items() if blocks} >= DOCUMENTED


@pytest.mark.parametrize("title", sorted(t for t, blocks in SECTIONS.items() if blocks))
def test_section_examples_run(
    title: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"docs_callbacks_{title}"}
    for i, code in enumerate([*SETUP, *SECTIONS[title]]):
        exec(compile(code, f"{DOC.name}[{title} #{i}]", "exec"), namespace)
    out = capsys.readouterr().out
    assert out  # every section prints what it shows
