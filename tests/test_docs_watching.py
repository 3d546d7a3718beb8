"""The ```python examples of docs/watching-a-run.md run and print what the page says."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs_pages import Page

PAGE = Page.read("watching-a-run.md")
EXPECTED = {
    "Metrics for a run": [
        'trainbus_batches_total{run="docs"} 16.0',
        'trainbus_step_duration_seconds_count{run="docs"} 15.0',
    ],
    "The health check": ["starting", "ended True 8 30.0"],
}


def test_the_page_runs_top_to_bottom_and_prints_what_it_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert set(PAGE.sections) == set(EXPECTED)
    printed = PAGE.run_all_printing(capsys)
    for title, lines in EXPECTED.items():
        assert printed[title].splitlines() == lines
        for line in lines:
            assert f"# {line}" in PAGE.text  # the page shows what the code prints
