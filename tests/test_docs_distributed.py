"""The ```python examples of docs/distributed.md run (in one process) and print what it says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "distributed.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def test_examples_run_and_print_what_the_page_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    text = DOC.read_text(encoding="utf-8")
    blocks = BLOCK.findall(text.split("\n## Ray Train\n")[0])  # Ray's: tests/integrations
    assert len(blocks) == 2
    namespace: dict[str, object] = {"__name__": "docs_distributed"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"{DOC.name}[#{i}]", "exec"), namespace)
    out = capsys.readouterr().out.splitlines()
    assert out == ["True True False", "0 1 0 True"]
    assert "prints `True True False`" in text
    assert "prints `0 1 0 True`" in text


def test_the_rank_zero_only_table_matches_the_classes() -> None:
    import trainbus.callbacks
    import trainbus.loggers

    text = DOC.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| rank zero only |"))
    named = set(re.findall(r"`(\w+)`", row))
    marked = {
        name
        for module in (trainbus.callbacks, trainbus.loggers)
        for name in module.__all__
        if getattr(getattr(module, name), "rank_zero_only", False) is True
    }
    assert named == marked
