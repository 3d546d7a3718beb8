"""The first ```python example of docs/service.md (EventStream) runs as printed.

The page's other blocks are the files of ``examples/service/`` (``tests/test_serve.py`` runs
them and checks that the page shows them verbatim), the ``trainbus.serve`` job factory
(also checked there), and an aiohttp sketch that serves until Ctrl-C.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs_pages import BLOCK, DOCS

DOC = DOCS / "service.md"


def test_the_event_stream_example_runs_as_printed_and_prints_what_the_page_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: the example used ``model``, ``loader`` and ``send`` without defining them,
    and ``async with`` at the top level of a script."""
    monkeypatch.chdir(tmp_path)
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## EventStream") :]
    code = BLOCK.findall(section)[0]
    exec(compile(code, f"{DOC.name}[EventStream #0]", "exec"), {"__name__": "__main__"})
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [
        "StreamEvent(init, epoch=0, batch=0)",
        "StreamEvent(fit_start, epoch=0, batch=0)",
        "StreamEvent(epoch_start, epoch=0, batch=0)",
    ]
    assert "StreamEvent(batch_end, epoch=0, batch=3)" in lines
    assert re.fullmatch(r"StreamMetrics\(step=3, loss/train=[\d.]+\)", lines[lines.index(
        "StreamEvent(batch_end, epoch=0, batch=3)") - 1])
    assert lines[-2:] == ["StreamEvent(fit_end, epoch=2, batch=8)", "23 items sent"]
    for shown in ("`StreamEvent(init, epoch=0, batch=0)`", "`StreamEvent(batch_end, epoch=0, "
                  "batch=3)`", "`StreamEvent(fit_end, epoch=2, batch=8)`", "`23 items sent`"):
        assert shown in section  # the page says what the code prints
    assert "# StreamEvent(batch_end, epoch=0, batch=3)" in code
