"""The ```python examples of docs/checkpoints.md run as a reader runs them.

Every block, top to bottom, in one namespace and one working folder (``Page.run_all``):
sections that reused a folder collided there (``FileExistsError``) although each ran fine
alone in a fresh one. What each section prints is checked against the page.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs_pages import Page

PAGE = Page.read("checkpoints.md")
DOC = PAGE.path
SETUP, SECTIONS = PAGE.setup, PAGE.sections
EXPECTED = {
    "Saving": ["4 ['ep1-ba4.pt']", "6 ['ep1-ba6.pt']"],
    "Resuming": [
        "[('init', 0), ('fit_start', 1), ('after_dataloader', 1), ('batch_start', 1)]",
        "same weights: True",
        "resumed at batch 6",
    ],
    "Restarting from an older checkpoint": [
        "['ep0-ba3-rank0.pt', 'ep1-ba4-rank0.pt', 'ep1-ba5-rank0.pt', 'ep1-ba6-rank0.pt']",
        "ran to batch 6 warned: True",
    ],
    "Uploading to S3": [
        "['ep1-ba4-rank0.pt', 'ep1-ba6-rank0.pt']",
        "resumed from s3 at batch 6",
    ],
    "Integrity": [
        "refused: True", "resumed from the intact one at batch 3", "warned: True",
    ],
    "Load errors": [
        "load_path='missing.pt' does not exist",
        "load_path='torn.pt' cannot be read as a checkpoint: it is truncated or corrupt",
        "is a checkpoint of another model",
        "weight: checkpoint (3, 4) vs model (5, 4)",
    ],
}


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
            assert expected in printed[title], (title, expected)
    text = DOC.read_text(encoding="utf-8")
    for title, expected_lines in EXPECTED.items():
        if title != "Load errors":  # the page says what the code prints
            for expected in expected_lines:
                assert f"`{expected}`" in text
