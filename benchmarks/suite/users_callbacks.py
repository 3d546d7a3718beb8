"""The callbacks users turn on (issue 55): progress output, JSON-lines, TensorBoard, the LR
and throughput monitors, a checkpoint every 50 batches, on the ``g10`` workload.

Arms (``suite/_users_callbacks_arms.py`` says what each runs): the plain loop without I/O
(the floor), the plain loop doing the same I/O inline, trainbus, Lightning and Composer with
their own built-ins (from ``benchmarks/.venvs``; a missing one is named in the row). Each
arm of each round is a fresh process; the arms' order rotates round by round; every figure
is the training part (first batch to the end of ``fit``) as a ratio to the floor of the
same round, median (min-max) over the rounds. Target: trainbus at or under the plain loop
doing the same I/O inline (paired round by round), on the way to 1.05x of the floor.

A full run: 300 batches, 13 rounds (about 15 minutes with both peers, on a quiet machine);
``--quick``: 40 batches, 3 rounds.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from harness import stats
from harness.runner import BENCH, Context, env_for, python_for

FIGURE = "the callbacks users turn on (wall, ratio to the plain loop without I/O)"
FIGURE_DIFF = "the callbacks users turn on: trainbus over the inline loop (ms a batch)"
ARMS = ("floor", "inline", "trainbus", "lightning", "composer")
PEER_ADAPTER = {"lightning": "lightning_fw", "composer": "composer_fw"}
TARGET_FLOOR = 1.05


def sizes(quick: bool) -> tuple[int, int]:
    """``(batches, rounds)``."""
    return (40, 3) if quick else (300, 13)


def _interpreter(ctx: Context, arm: str) -> tuple[str | None, dict[str, str], str]:
    """The arm's python, its environment, and why it cannot run (``""``: it can)."""
    adapter = PEER_ADAPTER.get(arm, "trainbus_fw")
    if arm in PEER_ADAPTER:
        why = ctx.missing(adapter)
        if why:
            return None, {}, why
    return str(python_for(adapter)), env_for(adapter), ""


def one(python: str, env: dict[str, str], arm: str, batches: int, ckpt: bool) -> dict[str, Any]:
    """One fit of ``arm`` in a fresh process, in a fresh folder; its JSON result."""
    with tempfile.TemporaryDirectory(prefix=f"users-{arm}-") as tmp:
        out = Path(tmp) / "result.json"
        folder = Path(tmp) / "run"
        folder.mkdir()
        kwargs = {"batches": batches, "ckpt": ckpt, "folder": str(folder), "out": str(out)}
        with open(Path(tmp) / "stdout.txt", "w") as stdout:  # the progress lines go here
            proc = subprocess.run(
                [python, "-m", "suite._users_callbacks_arms", arm, json.dumps(kwargs)],
                cwd=BENCH, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True,
                timeout=900,
            )
        if proc.returncode or not out.exists():
            raise RuntimeError(f"arm {arm} failed:\n{proc.stderr[-3000:]}")
        return dict(json.loads(out.read_text()))


def measure_rounds(ctx: Context, batches: int, rounds: int, ckpt: bool = True
                   ) -> tuple[dict[str, list[float]], dict[str, str], dict[str, float]]:
    """Seconds per arm per round (rotated order), why arms were left out, and checksums."""
    runnable: dict[str, tuple[str, dict[str, str]]] = {}
    left_out: dict[str, str] = {}
    for arm in ARMS:
        python, env, why = _interpreter(ctx, arm)
        if python is None:
            left_out[arm] = why
        else:
            runnable[arm] = (python, env)
    names = list(runnable)
    seconds: dict[str, list[float]] = {arm: [] for arm in names}
    checksums: dict[str, float] = {}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for arm in order:
            python, env = runnable[arm]
            result = one(python, env, arm, batches, ckpt)
            seconds[arm].append(result["seconds"])
            checksums[arm] = result["checksum"]
        ctx.log(f"  users_callbacks round {r + 1}/{rounds}: "
                + ", ".join(f"{a} {seconds[a][-1]:.2f} s" for a in names))
    return seconds, left_out, checksums


def run(ctx: Context) -> list[dict[str, Any]]:
    batches, rounds = sizes(ctx.quick)
    seconds, left_out, checksums = measure_rounds(ctx, batches, rounds)
    floor = seconds["floor"]
    same = max(checksums.values()) - min(checksums.values()) < 1e-6 * max(
        1.0, abs(statistics.median(checksums.values())))
    parts = []
    ratios: dict[str, Any] = {}
    for arm in ARMS[1:]:
        if arm not in seconds:
            parts.append(f"{arm}: {left_out[arm]}")
            continue
        s = stats.paired(seconds[arm], floor)
        ratios[arm] = s.as_dict()
        parts.append(f"{arm} {s.median:.2f}x ({s.min:.2f}-{s.max:.2f})")
    per_batch = statistics.median(floor) / batches * 1e3
    trainbus_vs_inline = stats.paired(seconds["trainbus"], seconds["inline"])
    diff_ms = [(t - i) / batches * 1e3 for t, i in zip(seconds["trainbus"], seconds["inline"],
                                                        strict=True)]
    slower = sum(d > 0 for d in diff_ms)
    note = "" if same else "; the arms' parameter checksums differ"
    rows = [
        stats.row(FIGURE, f"trainbus <= the inline loop; on the way to {TARGET_FLOOR:.2f}x",
                  "; ".join(parts) + f"; floor {per_batch:.2f} ms a batch, {batches} batches, "
                  f"{rounds} rounds{note}",
                  stats.verdict(trainbus_vs_inline.median, trainbus_vs_inline.spread, 1.0),
                  unit="ratio", ratios=ratios, left_out=left_out, **seconds),
        stats.row(FIGURE_DIFF, "<= 0",
                  f"{statistics.median(diff_ms):+.2f} ms a batch ({min(diff_ms):+.2f} to "
                  f"{max(diff_ms):+.2f}); trainbus slower in {slower} of {rounds} rounds",
                  stats.verdict(stats.summarize(diff_ms).median,
                                stats.summarize(diff_ms).spread, 0.0),
                  unit="ms", diff_ms=diff_ms),
    ]
    return rows
