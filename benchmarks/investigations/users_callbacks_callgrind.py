"""Where trainbus's time goes with the callbacks users turn on: instructions per batch,
training thread and all threads, by component (callgrind; load-independent).

    python benchmarks/investigations/users_callbacks_callgrind.py            # tiny, 50 batches
    python benchmarks/investigations/users_callbacks_callgrind.py --workload g10 --batches 50

The callback set of ``suite/users_callbacks.py`` (progress every 10 batches, JSON-lines,
TensorBoard, LR and throughput monitors, a checkpoint every 50 batches), taken apart: the
plain loop without I/O (the floor), the plain loop doing the I/O inline, trainbus with no
callbacks (the loop and the bus: with no destination the loss is not logged), trainbus with
each callback alone (a destination brings the per-batch loss record with it), and trainbus
with all of them. Each config: one warm-up fit of 10 batches, then fits of B and 2B batches
with instrumentation on only around each; the difference over B is one batch's count (a
fit's fixed costs cancel; B = 50 holds one checkpoint).

Python 3.11 frames are invisible to callgrind (it sees the interpreter's C functions), so
the split is by component, measured apart: each callback's inclusive cost is its config
minus trainbus with no callbacks, the bus's is trainbus with no callbacks minus the floor.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))

from harness import workload as wl  # noqa: E402
from harness.runner import _totals, env_for, python_for  # noqa: E402

COMPONENTS = ("LRMonitor", "SpeedMonitor", "ProgressBar", "JSONLinesLogger",
              "TensorBoardLogger", "CheckpointSaver")
CONFIGS = ("floor", "inline", "trainbus-bare", *(f"trainbus+{c}" for c in COMPONENTS),
           "trainbus-all")


def _trainbus_fit(w: wl.Workload, data: Any, folder: Path, parts: tuple[str, ...]) -> None:
    from trainbus import Trainer
    from trainbus.callbacks import CheckpointSaver, LRMonitor, ProgressBar, SpeedMonitor
    from trainbus.loggers import JSONLinesLogger, TensorBoardLogger

    make = {
        "LRMonitor": lambda: LRMonitor(),
        "SpeedMonitor": lambda: SpeedMonitor(window_size=100),
        "CheckpointSaver": lambda: CheckpointSaver(str(folder / "ckpt"), save_interval="50ba",
                                                   num_checkpoints_to_keep=-1),
        "ProgressBar": lambda: ProgressBar(interval="10ba"),
        "JSONLinesLogger": lambda: JSONLinesLogger(str(folder / "metrics.jsonl")),
        "TensorBoardLogger": lambda: TensorBoardLogger(str(folder / "tb")),
    }
    destinations = {"ProgressBar", "JSONLinesLogger", "TensorBoardLogger"}
    callbacks = [make[p]() for p in parts if p not in destinations]
    loggers = [make[p]() for p in parts if p in destinations]
    trainer = Trainer(w.model, data, "1ep", loss_fn=w.loss_fn, optimizers=w.optimizer(),
                      callbacks=callbacks, loggers=loggers, device="cpu")
    trainer.fit_sync()


def _fit(config: str, w: wl.Workload, data: Any, folder: Path) -> None:
    from suite import _users_callbacks_arms as arms

    if config == "floor":
        arms.floor(w, data, folder, True)
    elif config == "inline":
        arms.inline(w, data, folder, True)
    elif config == "trainbus-bare":
        _trainbus_fit(w, data, folder, ())
    elif config == "trainbus-all":
        _trainbus_fit(w, data, folder, COMPONENTS)
    else:
        _trainbus_fit(w, data, folder, (config.split("+", 1)[1],))


def child(workload: str, batches: int) -> None:
    """Under callgrind: per config a warm-up fit, then B and 2B batches, each dumped."""
    import torch.utils.tensorboard  # noqa: F401  (imported before any count)

    def ctl(*args: str) -> None:
        import os

        subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True,
                       capture_output=True)

    w = wl.make_workload(workload, 2 * batches)
    for config in CONFIGS:
        with tempfile.TemporaryDirectory() as tmp:
            _fit(config, w, wl.TimedBatches(w.batches[:10]), Path(tmp) / "warm")
            for n in (batches, 2 * batches):
                folder = Path(tmp) / f"run{n}"
                folder.mkdir()
                gc.collect()
                ctl("-i", "on")
                _fit(config, w, wl.TimedBatches(w.batches[:n]), folder)
                ctl("-i", "off")
                ctl("-d")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="tiny", choices=sorted(wl.WORKLOADS))
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.child:
        child(args.workload, args.batches)
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
               f"--callgrind-out-file={out}", str(python_for("trainbus_fw")), __file__,
               "--child", "--workload", args.workload, "--batches", str(args.batches)]
        proc = subprocess.run(cmd, cwd=BENCH, env=env_for("trainbus_fw"), text=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if proc.returncode:
            raise SystemExit(f"callgrind failed:\n{proc.stderr[-3000:]}")
        dumps: dict[int, list[tuple[int, bool]]] = {}
        for path in Path(tmp).glob("cg.out.*"):
            number = int(path.name.split(".")[-1].split("-")[0])
            dumps.setdefault(number, []).append(_totals(path))

    def figures(number: int) -> tuple[int, int]:
        threads = dumps.get(number, [])
        trained = [total for total, addmm in threads if addmm]
        return (max(trained) if trained else 0), sum(total for total, _ in threads)

    rows: dict[str, tuple[float, float]] = {}
    for i, config in enumerate(CONFIGS):
        t1, a1 = figures(2 * i + 1)
        t2, a2 = figures(2 * i + 2)
        rows[config] = ((t2 - t1) / args.batches, (a2 - a1) / args.batches)
    floor_t, floor_a = rows["floor"]
    bare_t, bare_a = rows["trainbus-bare"]
    print(f"instructions per batch, workload {args.workload}, B = {args.batches}")
    print(f"{'config':28} {'training thread':>16} {'all threads':>14} "
          f"{'over base, train':>17} {'over base, all':>15}")
    for config, (t, a) in rows.items():
        base_t, base_a = (bare_t, bare_a) if config.startswith("trainbus+") else (floor_t, floor_a)
        print(f"{config:28} {t:16,.0f} {a:14,.0f} {t - base_t:+17,.0f} {a - base_a:+15,.0f}")
    parts_t = sum(rows[f"trainbus+{c}"][0] - bare_t for c in COMPONENTS)
    parts_a = sum(rows[f"trainbus+{c}"][1] - bare_a for c in COMPONENTS)
    all_t, all_a = rows["trainbus-all"]
    print(f"(trainbus+X is over trainbus-bare, the rest over the floor; the parts add to "
          f"{parts_t:+,.0f} / {parts_a:+,.0f}, all of them together "
          f"{all_t - bare_t:+,.0f} / {all_a - bare_a:+,.0f})")
    if args.json:
        args.json.write_text(json.dumps({"workload": args.workload, "batches": args.batches,
                                         "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
