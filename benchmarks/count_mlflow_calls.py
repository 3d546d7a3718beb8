"""Function calls and event-loop iterations per batch that logging to MLflow costs, per thread.

A measure that does not depend on the machine's load: the trainbus rows of
bench_mlflow.py (10 metrics logged per batch from a ``@blocking`` callback; the stub
server in a process of its own) run under a profile hook that counts every Python and C
function call, per thread, over batches 101-300; and the event loop's iterations
(``asyncio``'s ``_run_once``). Counts per batch, with the difference from ``tb-none``
(the same callback logging nothing); ``tb-nobody`` logs with no destination attached. The
hook slows everything down several times, which changes how many records a wake-up finds
waiting: read the other threads' counts as upper bounds per record (a loaded machine
batches more per wake-up, never fewer).

Run:  PYTHONPATH=src python benchmarks/count_mlflow_calls.py
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
import bench_mlflow as bench  # noqa: E402

counting = False
calls: Counter[int] = Counter()
loop_iterations = 0


def hook(frame: Any, event: str, arg: Any) -> None:
    global loop_iterations
    if counting and (event == "call" or event == "c_call"):
        calls[threading.get_ident()] += 1
        if event == "call" and frame.f_code.co_name == "_run_once":
            loop_iterations += 1


def toggle(on: bool) -> None:
    global counting
    counting = on


def main() -> None:
    import torch
    import workloads

    torch.set_num_threads(1)
    w = workloads.make_workload("mlp")
    w.batches = w.batches * 2  # 400: count batches 101-300
    bench.INSTRUMENT, bench.TOGGLE = (100, 300), toggle
    stub = bench.StubProcess()
    rows = {}
    try:
        for kind in ("none", "nobody", "null", "null-thread", "mlflow-stub"):
            bench.with_trainbus(w, kind, stub.url, "count", None, None)  # warm-up
            calls.clear()
            global loop_iterations
            loop_iterations = 0
            trainer_thread: list[int] = []
            original = bench.mp.Meter.mark

            def mark(self: Any, original: Any = original,
                     trainer_thread: list[int] = trainer_thread) -> None:
                if not trainer_thread:
                    trainer_thread.append(threading.get_ident())
                original(self)

            bench.mp.Meter.mark = mark  # type: ignore[method-assign]
            sys.setprofile(hook)
            threading.setprofile(hook)
            try:
                bench.with_trainbus(w, kind, stub.url, "count", None, None)
            finally:
                sys.setprofile(None)
                threading.setprofile(None)  # type: ignore[arg-type]
                bench.mp.Meter.mark = original  # type: ignore[method-assign]
            train = calls[trainer_thread[0]]
            loop = calls[threading.main_thread().ident or 0]
            other = sum(calls.values()) - train - loop
            rows[kind] = (train / 200, loop / 200, other / 200, loop_iterations / 200)
    finally:
        stub.stop()
    base = rows["none"]
    print("calls per batch over batches 101-300 (difference from tb-none)")
    print(f"{'scenario':<16}{'training thread':>22}{'event loop':>22}{'other threads':>22}"
          f"{'loop iterations':>22}")
    for kind, row in rows.items():
        print(f"tb-{kind:<13}" + "".join(f"{v:>12.1f} ({v - b:+7.1f})" for v, b in
                                         zip(row, base, strict=True)))


if __name__ == "__main__":
    main()
