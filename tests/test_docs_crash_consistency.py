"""The ```python examples of docs/crash-consistency.md run and print what the page says.

The blocks before the first ``## `` heading are the shared setup; each section with
examples runs the setup and then its own blocks, in one namespace, in a fresh folder.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "crash-consistency.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
EXPECTED = {
    "The JSON-lines file": ["steps: [1, 2, 3, 4, 5, 6]"],
}


def _sections() -> tuple[list[str], dict[str, list[str]]]:
    parts = re.split(r"^## (.+)$", DOC.read_text(encoding="utf-8"), flags=re.MULTILINE)
    sections = {
        title.strip(): BLOCK.findall(body)
        for title, body in zip(parts[1::2], parts[2::2], strict=True)
    }
    return BLOCK.findall(parts[0]), sections


SETUP, SECTIONS = _sections()


def test_sections_with_examples() -> None:
    assert SETUP
    assert {title for title, blocks in SECTIONS.items() if blocks} == set(EXPECTED)


@pytest.mark.parametrize("title", sorted(EXPECTED))
def test_section_examples_run_and_print_what_the_page_says(
    title: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"docs_crash_{title}"}
    for i, code in enumerate([*SETUP, *SECTIONS[title]]):
        exec(compile(code, f"{DOC.name}[{title} #{i}]", "exec"), namespace)
    out = capsys.readouterr().out
    for expected in EXPECTED[title]:
        assert expected in out
