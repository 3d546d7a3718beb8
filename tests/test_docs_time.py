"""The ```python examples of docs/where-the-time-went.md run as a reader runs them, and the
page's picture is the report it describes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs_pages import DOCS, Page

PAGE = Page.read("where-the-time-went.md")


def test_the_page_runs_and_prints_the_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    printed = PAGE.run_all_printing(capsys)
    out = printed["The account in code"]
    assert out.startswith("10 batches; SlowPlot cost the training thread ")
    assert "where the time went (10 batches" in out and "SlowPlot" in out


def test_every_part_of_the_account_is_explained() -> None:
    from trainbus import TimeAccount

    text = PAGE.text
    for part in TimeAccount.PARTS:
        assert f"- **{part}**" in text, part
    assert (DOCS / "report.png").stat().st_size > 10_000
    assert "![The report of `trainbus demo`](report.png)" in text
