"""What a run's JSON-lines metrics file holds, read for the report.

The file is :class:`~trainbus.loggers.JSONLinesLogger`'s: one point a line, ``{"name",
"value", "step", "wall_time", "level", "kind"}``, in logged order. The report needs:

- the curves: every numeric metric point outside ``time/``, by name, in logged order;
- the fits: ``time/fit_start`` (logged by the time account at each fit's start: the batch
  it starts from, above 0 after a resume) splits the file into fits;
- the time account at each epoch's end: the ``time/...`` points logged together (one
  record: same step and wall time) add up from their fit's start, so an epoch's own share
  is the difference from the fit's previous record.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["AccountRecord", "RunData", "find_metrics_file", "read_run"]

#: The parts of the account that add up to the wall time, in the order they are drawn
#: (``TimeAccount.PARTS``; kept here so that reading a file needs no torch).
PARTS = (
    "startup", "data", "compute", "evaluation", "checkpoint", "callbacks", "bus",
    "replayed", "close", "other",
)
_CALLBACK = "time/callback/"


@dataclass
class AccountRecord:
    """One logging of the account: values from its fit's start, at ``step``."""

    step: int
    fit: int
    values: dict[str, float] = field(default_factory=dict)
    callbacks: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class RunData:
    """A run's file, read.

    Attributes:
        path: The file read.
        curves: Per metric name, its ``(step, value)`` points in logged order.
        resumes: The batches at which a fit started after the first (resumes, or a
            continued ``fit(duration=...)``).
        accounts: Every logging of the time account, in order.
        points: Lines read.
        skipped: Lines that did not parse (a torn line) or held no number.
    """

    path: Path
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    resumes: list[int] = field(default_factory=list)
    accounts: list[AccountRecord] = field(default_factory=list)
    points: int = 0
    skipped: int = 0


def find_metrics_file(source: Path) -> Path:
    """``source`` if it is a file, else the one ``*.jsonl`` metrics file in the folder
    (``metrics.jsonl`` first)."""
    if source.is_file():
        return source
    if not source.is_dir():
        raise FileNotFoundError(
            f"{str(source)!r} is neither a run folder nor a JSON-lines file; pass the folder "
            "a JSONLinesLogger wrote into (e.g. runs/demo) or its .jsonl file"
        )
    preferred = source / "metrics.jsonl"
    if preferred.is_file():
        return preferred
    found = sorted(p for p in source.glob("*.jsonl") if p.is_file())
    if len(found) != 1:
        what = "no .jsonl file" if not found else f"{len(found)} .jsonl files"
        raise FileNotFoundError(
            f"{str(source)!r} holds {what}; pass the metrics file itself, e.g. "
            f"trainbus report {source}/metrics.jsonl"
        )
    return found[0]


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"):
        return float(value.replace("Infinity", "inf"))
    return None


def read_run(path: Path) -> RunData:
    """Read a JSON-lines metrics file (see the module docstring)."""
    run = RunData(path=path)
    fit = 0
    current: AccountRecord | None = None
    key: tuple[int, object] | None = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            run.points += 1
            try:
                point = json.loads(line)
                name, step = str(point["name"]), int(point["step"])
            except (ValueError, KeyError, TypeError):
                run.skipped += 1
                continue
            if point.get("kind", "metric") != "metric":
                continue
            value = _number(point.get("value"))
            if value is None:
                run.skipped += 1
                continue
            if not name.startswith("time/"):
                run.curves.setdefault(name, []).append((step, value))
                continue
            if name == "time/fit_start":
                fit += 1
                if fit > 1:
                    run.resumes.append(step)
                current, key = None, None
                continue
            record_key = (step, point.get("wall_time"))
            if current is None or record_key != key:
                current = AccountRecord(step=step, fit=fit)
                run.accounts.append(current)
                key = record_key
            if name.startswith(_CALLBACK):
                cb, _, field_name = name[len(_CALLBACK):].rpartition("/")
                current.callbacks.setdefault(cb, {})[field_name] = value
            else:
                current.values[name[len("time/"):]] = value
    return run


def epoch_shares(run: RunData) -> list[tuple[AccountRecord, dict[str, float]]]:
    """Each account record with its own share of each part (the difference from its fit's
    previous record; never below 0)."""
    out = []
    previous: AccountRecord | None = None
    for record in run.accounts:
        base = previous.values if previous is not None and previous.fit == record.fit else {}
        share = {
            part: max(0.0, record.values.get(part, 0.0) - base.get(part, 0.0))
            for part in PARTS
        }
        out.append((record, {k: v for k, v in share.items() if math.isfinite(v)}))
        previous = record
    return out
