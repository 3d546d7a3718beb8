"""Checkpoints: the training thread's stall per save, the host memory a save holds, RSS over
repeated saves, and the time until the file is complete on disk, for ``CheckpointSaver``
beside an inline ``torch.save``, Lightning's ``AsyncCheckpointIO`` and
``torch.distributed.checkpoint.async_save`` called by hand (``suite/_checkpoint_arms.py``
says how each is measured). Models of 10 MiB, 100 MiB and 1 GiB of state (parameters plus
Adam's two moments), CPU, one torch thread; each arm and size in a fresh process, the arms'
order rotated from size to size.

Rows:

- stall per save, per size: the trigger until the next batch starts plus the batches'
  time over their calm median while the write is in flight, median (min-max) over the
  saves; target: ``CheckpointSaver``'s median at most ``dcp.async_save``'s (the spread:
  the two arms' interquartile half-ranges added);
- extra host memory at a save's peak over training alone (the peak RSS of the save windows
  over the peak of the calm window before the first save), in copies of the state;
  target: at most one copy plus 2 MiB (a writer thread's stack and buffers; spread 0.5 MiB);
- RSS over 50 saves of the 10 MiB model (10 with ``--quick``): RSS at the last save's
  completion over the 5th's; target: flat (at most 5 MiB).

The measuring processes run with glibc's mmap threshold fixed at 128 KiB
(``MALLOC_MMAP_THRESHOLD_``), so that a freed tensor leaves RSS at once; with glibc's
default every arm's peak carries 0.1-0.3 copies of heap slack besides.

Lightning runs from ``benchmarks/.venvs/lightning`` when it exists, else from this
interpreter when it imports ``pytorch_lightning`` (the row says which).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from harness import stats
from harness.runner import BENCH, VENVS, Context, env_for, python_for

FIGURE = "checkpoint: training-thread stall per save"
FIGURE_MEMORY = "checkpoint: extra host memory at a save's peak"
FIGURE_RSS = "checkpoint: RSS over 50 saves"
LABELS = {"trainbus": "trainbus CheckpointSaver", "inline": "inline torch.save",
          "lightning": "Lightning AsyncCheckpointIO", "dcp": "dcp.async_save by hand"}
ARMS = tuple(LABELS)
FLAT_MIB = 5.0
SLACK_MIB = 2.0
#: glibc's mmap threshold, fixed in the measuring processes (its default moves up to 32 MiB
#: as tensors are freed, after which freed gradients stay in the heap: 0.1-0.3 copies of
#: slack in every arm's peak that belongs to the allocator, not to the way of saving)
MMAP_THRESHOLD = 128 * 1024


def plan(quick: bool) -> list[tuple[int, int]]:
    """``(MiB of state, saves)`` per size."""
    if quick:
        return [(10, 10), (100, 2)]
    return [(10, 50), (100, 5), (1024, 2)]


def _python(arm: str) -> tuple[str | None, str]:
    """The interpreter for ``arm`` and where it comes from (``None``: cannot run here)."""
    if arm != "lightning":
        return str(python_for("trainbus_fw")), "this interpreter"
    venv = VENVS / "lightning" / "bin" / "python"
    for py, where in ((venv, "benchmarks/.venvs/lightning"),
                      (Path(python_for("trainbus_fw")), "this interpreter")):
        if not py.exists():
            continue
        proc = subprocess.run([str(py), "-c", "import pytorch_lightning as pl; print(pl.__version__)"],
                              capture_output=True, text=True, env=env_for("trainbus_fw"))
        if proc.returncode == 0:
            return str(py), f"pytorch-lightning {proc.stdout.strip()} from {where}"
    return None, "pytorch-lightning is not installed here"


def _child(python: str, arm: str, mb: int, saves: int) -> dict[str, Any]:
    code = ("import json, sys; from suite._checkpoint_arms import measure; "
            "print('\\n' + json.dumps(measure(**json.loads(sys.argv[1]))))")
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
        args = {"arm": arm, "mb": mb, "saves": saves, "folder": str(Path(tmp) / "ckpt")}
        env = dict(env_for("trainbus_fw"), MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD))
        proc = subprocess.run([python, "-c", code, json.dumps(args)], cwd=BENCH, env=env,
                              capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise RuntimeError(f"checkpoint {arm} {mb} MiB failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _iqr_half(values: list[float]) -> float:
    if len(values) < 4:
        return (max(values) - min(values)) / 2
    q = statistics.quantiles(values, n=4)
    return (q[2] - q[0]) / 2


def _size(mb: int) -> str:
    return "1 GiB" if mb >= 1024 else f"{mb} MiB"


def _stall_row(mb: int, saves: int, results: dict[str, dict[str, Any]],
               missing: dict[str, str]) -> dict[str, Any]:
    cells, data = [], {}
    totals: dict[str, list[float]] = {}
    for arm in ARMS:
        if arm in missing:
            cells.append(f"{LABELS[arm]}: {missing[arm]}")
            continue
        r = results[arm]
        per = r["saves"][1:] if len(r["saves"]) > 2 else r["saves"]  # the first: page faults
        total = [s["stall_ms"] + s["extra_ms"] for s in per]
        stall = [s["stall_ms"] for s in per]
        complete = [s["complete_ms"] for s in per]
        totals[arm] = total
        t = stats.summarize(total)
        cells.append(f"{LABELS[arm]} {t.median:.0f} ms ({t.min:.0f}-{t.max:.0f}; at the "
                     f"trigger {statistics.median(stall):.0f} ms), complete on disk after "
                     f"{statistics.median(complete):.0f} ms")
        data[arm] = {"total_ms": t.as_dict(), "stall_ms": stall, "complete_ms": complete,
                     "batch_ms": r["batch_ms"], "state_mib": r["state_mib"]}
    tb = results.get("trainbus")
    if tb is not None and "capture_ms_max" in tb:
        cells.append(f"(trainbus's capture at most {tb['capture_ms_max']:.0f} ms, waited for "
                     f"a previous write {tb['wait_ms']:.0f} ms in all)")
    verdict = "not decided"
    if "trainbus" in totals and "dcp" in totals:
        mine, theirs = totals["trainbus"], totals["dcp"]
        spread = _iqr_half(mine) + _iqr_half(theirs)
        verdict = stats.verdict(statistics.median(mine), spread, statistics.median(theirs))
    batch = results.get("trainbus", {}).get("batch_ms", 0.0)
    quick = " (--quick)" if saves < 10 and mb > 10 else ""
    return stats.row(
        f"{FIGURE}, {_size(mb)} of parameters + Adam{quick}",
        "the in-memory capture only, <= dcp.async_save by hand",
        f"median over {saves} saves (a batch {batch:.0f} ms): " + "; ".join(cells),
        verdict, unit="ms per save",
        short=cells[0].removeprefix("trainbus CheckpointSaver ") if cells else "", **data)


def _memory_rows(results: dict[int, dict[str, dict[str, Any]]],
                 missing: dict[str, str], saves: int) -> list[dict[str, Any]]:
    cells, data, excess = [], {}, None
    for arm in ARMS:
        if arm in missing:
            continue
        for mb, by_arm in results.items():
            r = by_arm[arm]
            data.setdefault(arm, {})[mb] = {"peak_mib": r["peak_over_training_mib"],
                                            "state_mib": r["state_mib"]}
            if arm == "trainbus":
                over = r["peak_over_training_mib"] - r["state_mib"]
                excess = over if excess is None else max(excess, over)
        cells.append(f"{LABELS[arm]} " + ", ".join(
            f"{d['peak_mib'] / d['state_mib']:.2f} at {_size(mb)}"
            for mb, d in data[arm].items()))
    memory = stats.row(
        FIGURE_MEMORY, f"<= one copy of the state (parameters + Adam), + {SLACK_MIB:.0f} MiB "
        "(a writer thread's stack and buffers)",
        "copies of the state: " + "; ".join(cells),
        stats.verdict(excess if excess is not None else 99.0, 0.5, SLACK_MIB), unit="copies",
        short=cells[0].removeprefix("trainbus CheckpointSaver ") + " copies", **data)
    small = results[min(results)]
    cells, data, growth = [], {}, None
    for arm in ARMS:
        if arm in missing:
            continue
        rss = [s["rss_mib"] for s in small[arm]["saves"]]
        fifth = rss[min(4, len(rss) - 1)]
        data[arm] = {"rss_mib": rss, "start_mib": small[arm]["rss_start_mib"]}
        cells.append(f"{LABELS[arm]} {rss[-1] - fifth:+.1f} MiB (from {fifth:.0f} MiB; "
                     f"{rss[-1] - small[arm]['rss_start_mib']:+.0f} MiB over training alone)")
        if arm == "trainbus":
            growth = rss[-1] - fifth
    rss_row = stats.row(f"{FIGURE_RSS} ({_size(min(results))}{', --quick' if saves < 50 else ''})",
                        f"flat (<= +{FLAT_MIB:.0f} MiB from the 5th save to the last)",
                        f"after {saves} saves: " + "; ".join(cells),
                        stats.verdict(growth if growth is not None else 99.0, 1.0, FLAT_MIB),
                        unit="MiB", **data)
    return [memory, rss_row]


def run(ctx: Context) -> list[dict[str, Any]]:
    pythons, missing, lightning = {}, {}, ""
    for arm in ARMS:
        py, where = _python(arm)
        if py is None:
            missing[arm] = where
        else:
            pythons[arm] = py
            if arm == "lightning":
                lightning = where
    results: dict[int, dict[str, dict[str, Any]]] = {}
    rows = []
    for i, (mb, saves) in enumerate(plan(ctx.quick)):
        order = [a for a in ARMS if a in pythons]
        order = order[i % len(order):] + order[:i % len(order)]
        results[mb] = {}
        for arm in order:
            ctx.log(f"  checkpoint: {LABELS[arm]}, {_size(mb)}, {saves} saves")
            results[mb][arm] = _child(pythons[arm], arm, mb, saves)
        rows.append(_stall_row(mb, saves, results[mb], missing))
    rows += _memory_rows(results, missing, plan(ctx.quick)[0][1])
    if lightning:
        rows[0]["measured"] += f" (Lightning: {lightning})"
    return rows
