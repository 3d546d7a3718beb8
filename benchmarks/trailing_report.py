"""Scenario (g)'s summaries and tables (``bench_trailing.py``): per variant, wall clock
(min / median / spread, paired differences and ratios against ``no upload``) and the
CPU accounting (medians over rounds)."""

from __future__ import annotations

import math
import statistics
from typing import Any

__all__ = ["CPU_COLUMNS", "compact_table", "cpu_table", "summarize", "table"]

CPU_COLUMNS = {
    "train_cpu": "training thread CPU",
    "train_runq": "its run-queue wait",
    "train_wait": "its barrier waits",
    "train_other": "its off-CPU other",
    "train_waits": "its barrier waits (count)",
    "train_vcsw": "its voluntary switches (count)",
    "loop_cpu": "loop thread CPU",
    "reader_cpu": "thread reader CPU",
    "server_cpu": "server CPU",
    "process_cpu": "process CPU",
}


def summarize(runs: dict[str, list[dict[str, Any]]], bases: dict[str, str]) -> dict[str, Any]:
    """Per variant: wall-clock figures, paired against its baseline (``bases[variant]``;
    a baseline itself is paired with ``no upload``), and CPU medians."""
    out: dict[str, Any] = {}
    for variant, rs in runs.items():
        base_name = bases[variant] if bases[variant] != variant else "no upload"
        base = [run["ms"] for run in runs[base_name]]
        base_cpu = [run["train_cpu"] for run in runs[base_name]]
        ms = [run["ms"] for run in rs]
        row: dict[str, Any] = {
            "base": base_name,
            "min": min(ms),
            "median": statistics.median(ms),
            "spread": max(ms) - min(ms),
            "diff_median": statistics.median(m - b for m, b in zip(ms, base, strict=True)),
            "ratio_median": statistics.median(m / b for m, b in zip(ms, base, strict=True)),
            "cpu_diff_median": statistics.median(
                run["train_cpu"] - b for run, b in zip(rs, base_cpu, strict=True)
            ),
        }
        for key in CPU_COLUMNS:
            if key in rs[0]:
                row[key] = statistics.median(run[key] for run in rs)
        if "hidden" in rs[0] and variant not in bases.values():  # a baseline hides nothing
            row["hidden_median"] = statistics.median(run["hidden"] for run in rs)
        for key in ("truth_mismatches", "thread_reader_mismatches"):
            if key in rs[0]:
                row[key] = max(run[key] for run in rs)
        out[variant] = row
    return out


def table(summary: dict[str, Any], batches: int) -> str:
    """The wall-clock table (markdown)."""
    lines = [
        "| variant | ms/batch min / median (spread) | paired median vs | "
        "hidden (as `trainbus demo`) | `@blocking` reader saw another batch's weights | "
        "thread reader saw a later batch's weights |",
        "|---|---|---|---|---|---|",
    ]
    for variant, row in summary.items():
        paired = (f"{row['diff_median']:+.2f} ms ({row['ratio_median']:.2f}x) "
                  f"vs {row['base']}" if variant != row["base"] else "-")
        hidden = f"{row['hidden_median']:.0%}" if "hidden_median" in row else "-"
        truth, lag = (f"{row[key]} of {batches}" if key in row else "-"
                      for key in ("truth_mismatches", "thread_reader_mismatches"))
        lines.append(f"| {variant} | {row['min']:.2f} / {row['median']:.2f} "
                     f"({row['spread']:.2f}) | {paired} | {hidden} | {truth} | {lag} |")
    return "\n".join(lines)


def cpu_table(summary: dict[str, Any]) -> str:
    """The CPU-accounting table (markdown)."""
    lines = [
        "| per batch, median | " + " | ".join(CPU_COLUMNS.values()) + " |",
        "|---|" + "---|" * len(CPU_COLUMNS),
    ]
    for variant, row in summary.items():
        cells = [
            "-" if key not in row or math.isnan(row[key])
            else f"{row[key]:.2f}" if key in ("train_waits", "train_vcsw") else f"{row[key]:.2f} ms"
            for key in CPU_COLUMNS
        ]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compact_table(summary: dict[str, Any]) -> str:
    """One short line per variant (``--compact``): wall clock paired with its baseline, the
    training thread's CPU, barrier and other off-CPU waits, the loop's CPU, hidden share and
    whether the ``@blocking`` reader saw its batch's weights in every run."""
    lines = ["variant                      ms/b   paired  train_cpu  barrier  other  loop_cpu"
             "  hidden  blocking_ok"]
    for variant, row in summary.items():
        paired = f"{row['diff_median']:+.2f}" if variant != row["base"] else "-"
        hidden = f"{row['hidden_median']:.0%}" if "hidden_median" in row else "-"
        ok = "-" if "truth_mismatches" not in row else str(row["truth_mismatches"] == 0)
        cells = ["-" if math.isnan(value := row.get(key, math.nan)) else f"{value:.2f}"
                 for key in ("train_cpu", "train_wait", "train_other", "loop_cpu")]
        lines.append(f"{variant:<28} {row['median']:5.2f}  {paired:>6}  {cells[0]:>9}  "
                     f"{cells[1]:>7}  {cells[2]:>5}  {cells[3]:>8}  {hidden:>6}  {ok}")
    return "\n".join(lines)
