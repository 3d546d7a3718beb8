"""The ```python examples of docs/callbacks.md run as a reader runs them.

Every block, top to bottom, in one namespace and one working folder (``Page.run_all``); the
blocks before the first ``## `` heading are the shared setup. Fence an example as ```text
when it is not meant to run.
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


def test_the_page_runs_top_to_bottom_in_one_folder_and_every_section_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    printed = PAGE.run_all_printing(capsys)
    silent = [title for title in SECTIONS if not printed.get(title)]
    assert silent == []  # every section prints what it shows
