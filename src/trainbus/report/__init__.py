"""``trainbus report RUN``: one self-contained HTML page from a run's metrics file.

The page (inline SVG and CSS, nothing fetched, no script) shows the run's loss and metric
curves with every logged point and the batches it resumed from, its time account per epoch
as stacked bars, and its callbacks' costs: what ``Trainer.time_account`` logs as
``time/...`` metrics (``docs/where-the-time-went.md``).

Example:
    $ trainbus demo --out runs/demo
    $ trainbus report runs/demo
    runs/demo/report.html
"""

from __future__ import annotations

import os
from pathlib import Path

from trainbus.report._data import RunData, find_metrics_file, read_run
from trainbus.report._page import render

__all__ = ["RunData", "read_run", "write_report"]


def write_report(
    source: str | os.PathLike[str], out: str | os.PathLike[str] | None = None
) -> Path:
    """Write the report of a run and return its path.

    Args:
        source: A run folder (its ``metrics.jsonl``, or its only ``*.jsonl`` file) or a
            :class:`~trainbus.loggers.JSONLinesLogger` file.
        out: Where to write the page; default ``report.html`` beside the metrics file.

    Raises:
        FileNotFoundError: ``source`` is not a file or a folder holding one metrics file.
    """
    path = find_metrics_file(Path(source))
    target = Path(out) if out is not None else path.with_name("report.html")
    target.write_text(render(read_run(path)), encoding="utf-8")
    return target
