"""The ```python examples of docs/preemption.md run and print what the page says.

Every block, top to bottom, in one namespace and one working folder (``Page.run_all``), as
a reader runs them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs_pages import Page

PAGE = Page.read("preemption.md")
EXPECTED = {
    "The notice": [
        "exit status: 143",
        "reason: maintenance | stopped at batch 3 | checkpoints: [3]",
        "notice: spot notice, True time left, training thread still in batch 2",
        "preempted: True at batch 2",
    ],
    "The deadline": ["grace: 75.0 from TRAINBUS_PREEMPTION_GRACE"],
    "A notice the cluster announces": [
        "spot interruption | stopped at batch 5 | checkpoints: [5] | within 120 s: True",
    ],
    "Telling a preemption from a crash": ["143 True maintenance 4 ckpt-leave/ba4.pt"],
}


def test_sections_with_examples() -> None:
    assert PAGE.setup
    assert set(PAGE.sections) == set(EXPECTED)


def test_the_page_runs_top_to_bottom_and_prints_what_it_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    printed = PAGE.run_all_printing(capsys)
    for title, expected_lines in EXPECTED.items():
        for expected in expected_lines:
            assert expected in printed[title], (title, printed[title])
            assert expected in PAGE.text  # the page says what it prints
