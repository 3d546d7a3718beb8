"""Read an offline W&B run back from its files, with W&B's own reader.

``wandb leet inspect --json FOLDER`` (wandb >= 0.2x) prints every record of a run folder's
``.wandb`` transaction log as one JSON object per line. A run id's history is the history
rows of all its offline folders (``offline-run-<time>-<id>``: one per process that logged
into it), oldest first.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["offline_env", "run_folders", "wandb_history", "wandb_points"]


def offline_env(root: Path) -> dict[str, str]:
    """Environment for a W&B run that stays on this machine, its files under ``root``."""
    return {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(root),
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_CACHE_DIR": str(root / "cache"),
        "WANDB_CONFIG_DIR": str(root / "config"),
        "WANDB_DATA_DIR": str(root / "data"),
        "WANDB_X_STATS_SAMPLING_INTERVAL": "60",
    }


#: ``offline-run-<date>_<time>-<run id>[-<n>]`` (W&B adds ``-<n>`` when the name is taken).
_RUN_ID = re.compile(r"offline-run-\d{8}_\d{6}-([^-]+)(?:-\d+)?")


def run_folders(root: Path) -> list[Path]:
    """Every offline run folder under ``root``, oldest first."""
    return sorted((root / "wandb").glob("offline-run-*"))


def _records(folder: Path) -> list[dict[str, Any]]:
    if not any(folder.glob("run-*.wandb")):  # killed before W&B created its log: no rows
        return []
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(folder)],
        capture_output=True, text=True, timeout=120, check=True,
        env={**os.environ, "WANDB_SILENT": "true"},
    )  # fmt: skip
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def wandb_history(root: Path) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    """For each run id under ``root``: its history rows ``(step, {name: value})``, in the
    order W&B wrote them (W&B's own keys, ``_step``, ``_runtime``..., left out)."""
    runs: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for folder in run_folders(root):
        run_id = _RUN_ID.fullmatch(folder.name)[1]  # type: ignore[index]
        rows = runs.setdefault(run_id, [])
        for record in _records(folder):
            if record.get("type") == "history":
                history = record["history"]
                items = {k: v for k, v in history["item"].items() if not k.startswith("_")}
                rows.append((int(history.get("step", {}).get("num", 0)), items))
    return runs


def wandb_points(root: Path) -> dict[str, list[tuple[str, int, Any]]]:
    """For each run id: ``(name, step, value)`` of every value in its history rows."""
    return {
        run_id: [(name, step, value) for step, items in rows for name, value in items.items()]
        for run_id, rows in wandb_history(root).items()
    }
