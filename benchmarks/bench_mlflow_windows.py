"""MLflowLogger's cost per batch, paired within one run: logging toggled on and off in windows.

The fresh-run pairings of ``bench_mlflow.py`` (a ``tb-none`` fit against a ``tb-mlflow`` fit)
move +-0.3 ms/batch from one repetition to the next on the shared machine, three times the
+0.1 ms/batch target of issue 18. Here one ``Trainer`` runs with the logger attached for the
whole fit, and a ``@blocking`` batch_end callback (on the training thread, as in
``bench_mlflow.py``) computes the 10 metrics of every batch (``mlflow_points.values``) but
logs them only in "on" windows. Workload: ``bench_mlflow.py``'s (MLP 256-512-10, batch 64,
CPU, one torch thread), its 200 batches cycled to fill the fit.

Schedule: ``--warmup`` batches logging (the run is created, connections opened; not
measured), then ``--blocks`` blocks of 4 windows of ``--window`` batches, each block
A1 B1 B2 A2 (ABBA) or B1 A1 A2 B2 (BAAB), drawn at random (``--seed``): a linear drift within
a block cancels, and a periodic disturbance cannot keep step with the on windows (a first
run with ABBA only had its A/A control off 0 by +0.045 ms [+0.016, +0.068]). Two fits per
variant, one after the other:

    logging   A = on, B = off
    control   A = off, B = off (A/A): the same schedule, logging only in the warm-up; its
              "differences" show the method's own noise, which should centre on 0

(A control block interleaved in the logging fit would not do: the work a logging window
leaves behind, e.g. the server's, lands in the control block after it.)

Per batch the callback stores ``perf_counter``, ``thread_time`` (the training thread's CPU)
and ``process_time`` (every thread's CPU: the event loop, the logger's lane, httpx) into
preallocated lists, after logging. Per window, ms per batch:

    dropped    over the window's batches ``drop+1 .. window`` (``--drop``, default 20): a
               record logged in the previous window's last batches is delivered to the
               logger's lane up to 32 records or 10 ms later (the bus's deferral), i.e.
               in this window's first batches
    all        over all its batches (nothing dropped)

Per block, ms per batch:

    on - off   ((A1 - B1) + (A2 - B2)) / 2: each on window paired with its off neighbour; a
               linear drift cancels (dropped, and all); every block
    spill      ABBA blocks: B1 - B2 (all), the off window after an on window less the off
               window after an off window: the logging's work that lands after its window
               (the deferred records; the request sent when 1000 points wait, i.e. every 100
               on batches; the partial request sent every ``flush_interval`` = 1 s, wherever
               that tick falls; the server's work); a linear drift of s per window adds -s
    with spill ABBA blocks: on - off + spill (all): the cost per on batch with what the two
               on windows leave in the next off window (the block's extra time over B2,
               divided by its on batches); a linear drift of s per window adds -s

Over the blocks: min, p25, median, p75, max, and a distribution-free 95% confidence interval of
the median (``paired_stats.py``). Verdict on +0.1 ms/batch over the same loop logging nothing:
*shown* when the interval's top is <= 0.1, *refuted* when its bottom is > 0.1, *not decided*
otherwise.

Variants (two fits each, in this order; ``--variants``):

    nobody   no destination at all: ``log_metrics`` with nobody to receive the record
    null     a no-op plain ``def log_record`` destination: the bus's record path alone
    stub     ``MLflowLogger`` against ``bench_mlflow.py``'s stub (a process of its own
             answering at once, storing nothing)
    server   ``MLflowLogger`` against a real local ``mlflow server`` (sqlite; needs the
             ``mlflow`` package), started as ``bench_mlflow.py`` does
    floor    no trainbus at all, against the same real server: the hand-written loop
             computing the same values, each "on" batch appending its 10 points (dicts) to
             a list, and every 1,000 points or 1 s the list handed with
             ``call_soon_threadsafe`` to a task on an asyncio loop in a second thread, which
             ``json.dumps`` it and POSTs it with httpx to ``runs/log-batch``: the least a
             logger that sends from an event loop in the training process does
    floor-stub the floor against the stub (the same requests, with no server on these cores)

Every point must arrive: at the end the stub's count of metrics received and the server's
store (``mlflow_points.wait_readable``, then an exact count) are checked against 10 per on
batch; ``fit`` is the time from the last batch to ``fit()`` returning (delivery included).

Run:  PYTHONPATH=src python benchmarks/bench_mlflow_windows.py [--blocks 60] [--window 150]
      PYTHONPATH=src python benchmarks/bench_mlflow_windows.py --variants null,stub --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
import bench_mlflow as bench  # noqa: E402
import mlflow_points as mp  # noqa: E402
from mlflow_floor import train_floor  # noqa: E402
from paired_stats import median_interval, spread, verdict  # noqa: E402

TARGET = 0.1  # ms per batch
CLOCKS = ("wall", "cpu", "proc")
LABELS = {"wall": "wall", "cpu": "train-thread CPU", "proc": "process CPU"}


def schedule(warmup: int, blocks: int, window: int, logging: bool,
             seed: int = 0) -> tuple[bytearray, list[dict[str, Any]]]:
    """Per batch whether it logs, and the windows: block, label (A1 B1 B2 A2 or
    B1 A1 A2 B2, drawn per block with ``seed``), start, on."""
    draw = random.Random(seed)
    on = bytearray([1]) * warmup
    windows = []
    for block in range(blocks):
        order = "ABBA" if draw.random() < 0.5 else "BAAB"
        for label in ("A1", "B1", "B2", "A2") if order == "ABBA" else ("B1", "A1", "A2", "B2"):
            logs = logging and label[0] == "A"
            windows.append({"block": block, "order": order, "label": label, "start": len(on),
                            "on": logs})
            on += bytearray([logs]) * window
    return on, windows


def null_destination() -> Any:
    """A destination whose plain ``def log_record`` does nothing (a thread lane, as
    ``MLflowLogger``'s): ``bench_mlflow.py``'s ``tb-null-thread``."""
    import trainbus

    class SyncNull(trainbus.LoggerDestination):
        def log_record(self, record: trainbus.LogRecord) -> None:
            return None

    return SyncNull()


def train(w: Any, on: bytearray, destination: Any) -> dict[str, Any]:
    """One fit over ``len(on)`` batches; the marks per batch and the end of ``fit()``."""
    import trainbus
    from trainbus import Callback, Trainer

    n = len(on)
    marks = {clock: [0.0] * n for clock in CLOCKS}

    class Toggled(Callback):
        def __init__(self) -> None:
            self.i = 0

        @trainbus.blocking  # the training thread: its marks are that thread's
        def batch_end(self, state: Any, logger: Any) -> None:
            i = self.i
            metrics = mp.values(i + 1)
            if on[i]:
                logger.log_metrics(metrics, step=i + 1)
            marks["wall"][i] = time.perf_counter()
            marks["cpu"][i] = time.thread_time()
            marks["proc"][i] = time.process_time()
            self.i = i + 1

    toggled = Toggled()
    batches = (w.batches * (n // len(w.batches) + 1))[:n]
    Trainer(w.model, batches, "1ep", loss_fn=w.loss_fn, optimizers=w.optimizer(),
            callbacks=[toggled], loggers=[] if destination is None else [destination],
            device="cpu", warn_slow_callbacks=False, log_train_loss=False).fit_sync()
    ended = time.perf_counter()
    assert toggled.i == n, f"{toggled.i} batches of {n}"
    return {"marks": marks, "fit_ms": (ended - marks["wall"][-1]) * 1e3}


def per_window(marks: dict[str, list[float]], windows: list[dict[str, Any]], size: int,
               drop: int) -> list[dict[str, Any]]:
    """ms per batch of each window, ``dropped`` (its first ``drop`` batches left out) and
    ``all``; a batch's time runs from the previous batch's mark to its own."""
    out = []
    for win in windows:
        s, e = win["start"], win["start"] + size - 1
        row = dict(win)
        for clock in CLOCKS:
            m = marks[clock]
            row[clock] = (m[e] - m[s + drop - 1]) * 1e3 / (size - drop)
            row[clock + "_all"] = (m[e] - m[s - 1]) * 1e3 / size
        out.append(row)
    return out


def per_block(rows: list[dict[str, Any]], key: str) -> dict[str, list[float]]:
    """Per block, of ``key``: ``on - off`` ((A1 - B1) + (A2 - B2)) / 2, ``spill`` B1 - B2,
    ``with spill`` on - off + spill (the last two of ABBA blocks only)."""
    blocks: dict[int, dict[str, float]] = {}
    for r in rows:
        blocks.setdefault(r["block"], {})[r["label"]] = r[key]
    abba = {r["block"] for r in rows if r["order"] == "ABBA"}
    out: dict[str, list[float]] = {"on - off": [], "spill": [], "with spill": []}
    for i, b in blocks.items():
        on_off = ((b["A1"] - b["B1"]) + (b["A2"] - b["B2"])) / 2
        out["on - off"].append(on_off)
        if i in abba:
            out["spill"].append(b["B1"] - b["B2"])
            out["with spill"].append(on_off + b["B1"] - b["B2"])
    return out


def run_fit(name: str, w: Any, on: bytearray, stub: bench.StubProcess | None,
            server: Any) -> dict[str, Any]:
    """One fit of variant ``name`` (a fresh destination); its marks and what reached the
    stub or the server."""
    from trainbus.loggers import MLflowLogger

    expected = sum(on) * len(mp.KEYS)
    if name in ("floor", "floor-stub"):
        target = stub if name == "floor-stub" else None
        counted = target.counts()["points"] if target is not None else 0
        load = os.getloadavg()[0]
        result = train_floor(w, on, target.url if target is not None else server.url, CLOCKS)
        out_floor: dict[str, Any] = {
            "fit_ms": result["fit_ms"], "load_start": load, "load_end": os.getloadavg()[0],
            "points_expected": expected, "marks": result["marks"]}
        if target is not None:
            out_floor["points_delivered"] = target.counts()["points"] - counted
            return out_floor
        db = str(server.root / "mlflow.db")
        out_floor["readable_ms"] = (mp.wait_readable(db, result["run_id"], expected)
                                    - result["marks"]["wall"][-1]) * 1e3
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            out_floor["points_delivered"] = con.execute(
                "SELECT COUNT(*) FROM metrics WHERE run_uuid = ?",
                (result["run_id"],)).fetchone()[0]
        return out_floor
    if name == "nobody":
        destination: Any = None
    elif name == "null":
        destination = null_destination()
    else:
        url = stub.url if name == "stub" and stub is not None else server.url
        destination = MLflowLogger(url, experiment_name=f"windows-{uuid.uuid4().hex[:6]}")
    before = stub.counts() if name == "stub" and stub is not None else None
    load = os.getloadavg()[0]
    result = train(w, on, destination)
    out: dict[str, Any] = {"fit_ms": result["fit_ms"], "load_start": load,
                           "load_end": os.getloadavg()[0], "points_expected": expected,
                           "marks": result["marks"]}
    if before is not None and stub is not None:
        out["points_delivered"] = stub.counts()["points"] - before["points"]
    elif name == "server":
        db = str(server.root / "mlflow.db")
        run_id = destination.run_id
        out["readable_ms"] = (mp.wait_readable(db, run_id, expected)
                              - result["marks"]["wall"][-1]) * 1e3
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            out["points_delivered"] = con.execute(
                "SELECT COUNT(*) FROM metrics WHERE run_uuid = ?", (run_id,)).fetchone()[0]
    if name not in ("nobody", "null"):
        out["requests"] = destination.statistics().batches_sent
    return out


FIGURES = [("wall", "on - off"), ("wall_all", "on - off"), ("wall_all", "with spill"),
           ("cpu", "on - off"), ("cpu_all", "on - off"), ("cpu_all", "with spill"),
           ("proc", "on - off"), ("proc_all", "on - off"), ("proc_all", "with spill"),
           ("wall_all", "spill")]


def summarize(windows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The figures of one fit: per clock and figure (``FIGURES``), the per-block values
    and the confidence interval of their median."""
    rows = []
    for key, figure in FIGURES:
        xs = per_block(windows, key)[figure]
        rows.append({"key": key, "figure": figure, "diffs": xs, "interval": median_interval(xs)})
    return rows


def report(variants: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"{args.blocks} blocks ABBA or BAAB (seed {args.seed}) of windows of {args.window} "
          f"batches per fit, after "
          f"{args.warmup} warm-up batches; dropped: the first {args.drop} batches of each window; "
          f"MLP 256-512-10, batch 64, cpu, 1 torch thread; {os.cpu_count()} CPUs")
    print("\n| variant, fit | load (start-end) | B windows, median ms/batch | fit ms | "
          "readable ms | requests | points delivered / expected |\n|---|---|---|---|---|---|---|")
    for name, fits in variants.items():
        for kind, v in fits.items():
            offs = [r["wall"] for r in v["windows"] if r["label"][0] == "B"]
            readable = f"{v['readable_ms']:.1f}" if "readable_ms" in v else "-"
            print(f"| {name}, {kind} | {v['load_start']:.2f}-{v['load_end']:.2f} | "
                  f"{statistics.median(offs):.3f} | {v['fit_ms']:.1f} | {readable} | "
                  f"{v.get('requests', '-')} | "
                  f"{v.get('points_delivered', '-')} / {v['points_expected']} |")
    print("\nms per batch, per block: on - off = ((A1 - B1) + (A2 - B2)) / 2; spill = B1 - B2; "
          "with spill = on - off + spill (spill, with spill: ABBA blocks only)")
    print("\n| variant, fit (blocks) | figure | clock | min | p25 | median | p75 | max | "
          f"95% CI of the median | +{TARGET} ms |\n|---|---|---|---|---|---|---|---|---|---|")
    for name, fits in variants.items():
        for kind, v in fits.items():
            for row in v["summary"]:
                key = row["key"]
                clock = LABELS[key.split("_")[0]] + (
                    " (all)" if key.endswith("_all") else f" (drop {args.drop})")
                interval = row["interval"]
                shown = f"{interval[0]:+.3f} .. {interval[1]:+.3f}" if interval else "-"
                if kind == "logging" and row["figure"] != "spill":
                    judged = verdict(interval, TARGET)
                else:
                    judged = ("CI holds 0" if interval and interval[0] <= 0 <= interval[1]
                              else "CI misses 0" if interval else "")
                values = spread(row["diffs"], "+.3f") if row["diffs"] else " | ".join("-" * 5)
                print(f"| {name}, {kind} ({len(row['diffs'])}) | {row['figure']} | {clock} | "
                      f"{values} | {shown} | {judged} |")


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=60, help="ABBA/BAAB blocks per fit")
    parser.add_argument("--seed", type=int, default=0, help="draws each block's order")
    parser.add_argument("--window", type=int, default=150, help="batches per window")
    parser.add_argument("--drop", type=int, default=20, help="first batches of a window left out")
    parser.add_argument("--warmup", type=int, default=300, help="batches logging, not measured")
    parser.add_argument("--variants", default="null,stub,server",
                        help="comma-separated: nobody, null, stub, server, floor, floor-stub")
    parser.add_argument("--json", type=Path, help="write the windows and figures here")
    args = parser.parse_args(argv)
    names = args.variants.split(",")
    if unknown := set(names) - {"nobody", "null", "stub", "server", "floor", "floor-stub"}:
        parser.error(f"--variants: unknown {sorted(unknown)}; choose among nobody, null, stub, "
                     "server, floor, floor-stub")
    if not 0 < args.drop < args.window:
        parser.error(f"--drop must be between 1 and --window - 1 ({args.window - 1})")
    if args.warmup < 1 or args.blocks < 1:
        parser.error("--warmup and --blocks must be at least 1")
    import torch
    import workloads

    torch.set_num_threads(1)
    w = workloads.make_workload("mlp")
    plans = {kind: schedule(args.warmup, args.blocks, args.window, kind == "logging", args.seed)
             for kind in ("logging", "control")}
    variants: dict[str, dict[str, Any]] = {}
    stub = server = None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            stub = bench.StubProcess() if {"stub", "floor-stub"} & set(names) else None
            if "server" in names or "floor" in names:
                from tests.loggers.mlflow_server import MLflowServer

                server = MLflowServer(Path(tmp))
                server.start()
            train(w, plans["logging"][0][: args.warmup + 50], null_destination())  # warm-up
            for name in names:
                variants[name] = {}
                for kind, (on, windows) in plans.items():
                    v = run_fit(name, w, on, stub, server)
                    v["windows"] = per_window(v.pop("marks"), windows, args.window, args.drop)
                    v["summary"] = summarize(v["windows"])
                    variants[name][kind] = v
        finally:
            if server is not None:
                server.stop()
            if stub is not None:
                stub.stop()
    report(variants, args)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "variants": variants}))
    return variants


if __name__ == "__main__":
    main()
