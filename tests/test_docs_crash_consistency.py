"""The ```python examples of docs/crash-consistency.md run and print what the page says.

Every block, top to bottom, in one namespace and one working folder (``Page.run_all``), as
a reader runs them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs_pages import Page

PAGE = Page.read("crash-consistency.md")
DOC = PAGE.path
EXPECTED = {
    "The uploader's journal": ["before the Trainer: False", "with a CheckpointSaver: True"],
    "The JSON-lines file": ["steps: [1, 2, 3, 4, 5, 6]"],
    "The replay rule": ["steps: [1, 2, 3, 4, 5, 6]"],
}


SETUP, SECTIONS = PAGE.setup, PAGE.sections


def test_sections_with_examples() -> None:
    assert SETUP
    assert {title for title, blocks in SECTIONS.items() if blocks} == set(EXPECTED)


def test_the_page_runs_top_to_bottom_in_one_folder_and_prints_what_it_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    printed = PAGE.run_all_printing(capsys)
    for title, expected_lines in EXPECTED.items():
        for expected in expected_lines:
            assert expected in printed[title]
