"""The ```python examples of docs/callbacks.md run.

The blocks before the first ``## `` heading are the shared setup; each ``## `` section is
one test case that runs the setup and then its own blocks, in order, in one namespace,
in a fresh working folder. Fence an example as ```text when it is not meant to run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import trainbus.callbacks
from tests.docs_pages import Page

PAGE = Page.read("callbacks.md")
DOC = PAGE.path
DOCUMENTED = {
    "EarlyStopper", "GradMonitor", "LRMonitor", "MemoryMonitor", "ProgressBar",
    "SpeedMonitor", "ThresholdStopper",
}  # fmt: skip


SETUP, SECTIONS = PAGE.setup, PAGE.sections


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
    PAGE.run(title, namespace)
    out = capsys.readouterr().out
    assert out  # every section prints what it shows
