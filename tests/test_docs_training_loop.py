"""The ```python examples of docs/training-loop.md run, and print what their comments say.

The blocks run in order in one namespace; each ``print(...)  # expected`` line's output must
equal the text after ``# ``. The pseudocode block is checked to name every event.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import EventLog, make_trainer
from trainbus import Event

DOC = Path(__file__).resolve().parents[1] / "docs" / "training-loop.md"
TEXT = DOC.read_text(encoding="utf-8")
PYTHON = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
PSEUDOCODE = re.compile(r"^```text\n(.*?)^```", re.DOTALL | re.MULTILINE)
EXPECTED = re.compile(r"^\s*print\(.*\)\s+# (.*)$", re.MULTILINE)


def test_the_examples_run_and_print_what_they_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # in one fresh folder, as a reader runs the page
    blocks = PYTHON.findall(TEXT)
    assert len(blocks) >= 4
    namespace: dict[str, Any] = {"__name__": "docs_training_loop"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for i, code in enumerate(blocks):
            exec(compile(code, f"{DOC.name}[#{i}]", "exec"), namespace)
    expected = [line.rstrip() for block in blocks for line in EXPECTED.findall(block)]
    assert expected
    assert out.getvalue().splitlines() == expected


def test_the_pseudocode_names_every_event_in_the_order_the_trainer_fires_them() -> None:
    (pseudocode,) = PSEUDOCODE.findall(TEXT)
    names = re.findall(r"\b[A-Z][A-Z_]+[A-Z]\b", pseudocode)
    events = [name for name in names if name in Event.__members__]
    assert events == list(dict.fromkeys(events))  # each once
    log = EventLog()
    make_trainer(2, 1, [log], eval_batches=1, device="cpu").fit_sync()
    fired = [event.name for event in dict.fromkeys(log.names)]
    # evaluation is drawn apart, as a function: compare it, and the rest, in order
    assert [e for e in events if "EVAL_" not in e] == [e for e in fired if "EVAL_" not in e]
    assert [e for e in events if "EVAL_" in e] == [e for e in fired if "EVAL_" in e]
    assert set(events) == set(Event.__members__)


def test_the_event_docstring_names_every_event() -> None:
    doc = Event.__doc__ or ""
    assert all(re.search(rf"\b{name}\b", doc) for name in Event.__members__)
