"""The ```python examples of docs/checkpoints.md run.

The blocks before the first ``## `` heading are the shared setup; each ``## `` section runs
the setup and then its own blocks, in order, in one namespace, in a fresh working folder.
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
    "Uploading to S3": [
        "['ep1-ba4-rank0.pt', 'ep1-ba6-rank0.pt']",
        "resumed from s3 at batch 6",
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


@pytest.mark.parametrize("title", sorted(EXPECTED))
def test_section_examples_run_and_print_what_the_page_says(
    title: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"docs_checkpoints_{title}"}
    PAGE.run(title, namespace)
    out = capsys.readouterr().out
    for expected in EXPECTED[title]:
        assert expected in out
    if title != "Load errors":  # the page says what the code prints
        for expected in EXPECTED[title]:
            assert f"`{expected}`" in DOC.read_text(encoding="utf-8")
