"""The README's first example (the ``python`` block after the opening), run as written,
and the same script with its callback list emptied; wall clock of ``trainer.fit()`` (the
time it prints), ratio paired round by round, each run a fresh process. Target as (g)."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from harness import stats
from harness.runner import ROOT, Context, env_for, python_for

FIGURE = "the README's first example (wall, ratio to the same script without its callback)"
TARGET = 1.10


def scripts() -> tuple[str, str]:
    text = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    if code is None:
        raise RuntimeError("README.md has no ```python block")
    example = code.group(1)
    without, n = re.subn(r"callbacks=\[.*?\],", "callbacks=[],", example, flags=re.S)
    if n != 1:
        raise RuntimeError("cannot find the example's callbacks=[...]")
    # Without the callback the account has no upload to name: print the wall time alone.
    without, n = re.subn(
        r"    upload = next\(.*?\)\n    print\(.*?\)\n",
        '    print(f"{acct.batches} batches in {acct.wall:.2f} s")\n', without, flags=re.S,
    )
    if n != 1:
        raise RuntimeError("cannot find the example's upload line and its print")
    return example, without


def seconds(script: str) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(script)
    try:
        proc = subprocess.run([str(python_for("trainbus_fw")), f.name], env=env_for("trainbus_fw"),
                              capture_output=True, text=True, timeout=300)
    finally:
        Path(f.name).unlink()
    found = re.search(r"batches in ([\d.]+) s", proc.stdout)
    if proc.returncode or not found:
        raise RuntimeError(f"the example failed:\n{proc.stdout[-1000:]}{proc.stderr[-2000:]}")
    return float(found.group(1))


def run(ctx: Context) -> list[dict[str, Any]]:
    example, without = scripts()
    times: dict[str, list[float]] = {"example": [], "without": []}
    for r in range(ctx.rounds):
        for arm in (("example", "without") if r % 2 else ("without", "example")):
            times[arm].append(seconds(example if arm == "example" else without))
    s = stats.paired(times["example"], times["without"])
    base = stats.summarize(times["without"])
    return [stats.row(FIGURE, f"<= {TARGET:.2f}x (as (g))",
                      f"trainbus {s.median:.2f}x ({s.min:.2f}-{s.max:.2f}); without the "
                      f"callback {base.median:.2f} s", stats.verdict(s.median, s.spread, TARGET),
                      unit="ratio", ratio=s.as_dict(), **times)]
