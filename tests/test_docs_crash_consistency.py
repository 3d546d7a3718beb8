"""The ```python examples of docs/crash-consistency.md run and print what the page says.

The blocks before the first ``## `` heading are the shared setup; each section with
examples runs the setup and then its own blocks, in one namespace, in a fresh folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs_pages import Page

PAGE = Page.read("crash-consistency.md")
DOC = PAGE.path
EXPECTED = {
    "The JSON-lines file": ["steps: [1, 2, 3, 4, 5, 6]"],
}


SETUP, SECTIONS = PAGE.setup, PAGE.sections


def test_sections_with_examples() -> None:
    assert SETUP
    assert {title for title, blocks in SECTIONS.items() if blocks} == set(EXPECTED)


@pytest.mark.parametrize("title", sorted(EXPECTED))
def test_section_examples_run_and_print_what_the_page_says(
    title: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"docs_crash_{title}"}
    PAGE.run(title, namespace)
    out = capsys.readouterr().out
    for expected in EXPECTED[title]:
        assert expected in out
