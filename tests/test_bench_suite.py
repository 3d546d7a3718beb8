"""The benchmark suite's smoke test: ``benchmarks/run.py --quick`` writes its results JSON
and a README with every SPEC section 7 row and a verdict for each.

Figures are not asserted (timing claims belong to ``benchmarks/``). No peer venvs needed
(``--peers none``); callgrind must be installed. Takes a few minutes: marked slow.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: SPEC section 7's rows, as the suite names them (and the README's first example).
SPEC_ROWS = (
    "`@blocking` call (training thread)", "plain call, training thread",
    "`async def` call, training thread", "plain call, all threads",
    "`async def` call, all threads", "per batch, no callbacks, over the plain loop",
    "growth, 1 to 1,000 callbacks", "`engine.run_event()` from plain code, 10 callbacks",
    "(d) 4 callbacks sleeping 5 ms", "(e) a metrics upload per batch",
    "(g) a 5 ms awaited POST per batch", "(c) 100 no-op callbacks",
    "event-loop lateness p99 while training", "memory over 10^6 logged records",
    "the README's first example", "checkpoint: training-thread stall per save",
    "checkpoint: extra host memory at a save's peak", "checkpoint: RSS over 50 saves",
    "Prometheus metrics callback on vs off",
)
VERDICTS = {"met", "missed", "not decided"}


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind (callgrind)")
def test_quick_suite_writes_every_row_with_a_verdict(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--peers", "none",
         "--out", str(tmp_path)], capture_output=True, text=True, timeout=1100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "results" / "latest.json").read_text())
    assert results["errors"] == {}
    figures = [row["figure"] for row in results["rows"]]
    for spec_row in SPEC_ROWS:
        assert any(f.startswith(spec_row) for f in figures), spec_row
    for row in results["rows"]:  # a SPEC row has a target; the suite's own rows may not
        spec = any(row["figure"].startswith(spec_row) for spec_row in SPEC_ROWS)
        assert row["verdict"] in (VERDICTS if spec else VERDICTS | {"no target"}), row
    readme = (tmp_path / "README.md").read_text()
    for row in results["rows"]:
        assert row["figure"] in readme
    assert (tmp_path / "results" / "readme_table.md").exists()
    assert results["meta"]["loadavg"]["start"] and results["meta"]["versions"]
