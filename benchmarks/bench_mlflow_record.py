"""CPU cost of one logged record on MLflowLogger's side, before and after a change.

What one ``log_metrics`` of 10 floats costs inside ``MLflowLogger`` (``log_record``:
turning the record into items, sealing batches of 1000 points) and in the request body (``_attempt``: building the ``runs/log-batch`` body of each batch,
counted per record), without the bus and without the network (``send`` is replaced by a
function that returns at once). CPU time of this thread (``time.thread_time``), so the
figure does not depend on the other jobs of a loaded machine as much as wall time does;
the minimum over repeats within a round, the median over rounds.

With ``--before SRC`` the same measure runs against two source trees in alternating
subprocesses, round by round (ABAB), and prints the after/before ratio per round as
min / median / max (paired).

Run:  python benchmarks/bench_mlflow_record.py
      git archive HEAD~1 src | tar -x -C /tmp/before
      python benchmarks/bench_mlflow_record.py --before /tmp/before/src --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
KEYS = [f"m{i}" for i in range(10)]


def _drive(coro: Any) -> Any:
    """Run a coroutine that never suspends."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise RuntimeError("the coroutine suspended")


def measure(n: int = 2000, repeats: int = 5) -> dict[str, float]:
    """Microseconds of thread CPU per record: log_record, the request body, the total."""
    import trainbus.loggers.mlflow as module
    from trainbus.core.logger import LogRecord
    from trainbus.loggers import MLflowLogger

    async def no_send(client: Any, method: str, url: Any, headers: Any, body: Any) -> int:
        return len(body)

    module.send = no_send  # type: ignore[assignment]
    best = {"log_record": float("inf"), "body": float("inf")}
    size = 0
    for _ in range(repeats):
        logger = MLflowLogger("http://127.0.0.1:1", experiment_name="bench")
        logger._run = "0123456789abcdef0123456789abcdef"
        wall = time.time()
        records = [
            LogRecord({k: 0.5 + i + step * 1e-3 for i, k in enumerate(KEYS)}, step, wall)
            for step in range(n)
        ]
        t0 = time.thread_time()
        for record in records:
            result = logger.log_record(record)
            if result is not None:  # an async def log_record (before the thread lane)
                _drive(result)
        if hasattr(logger, "_take"):
            logger._take()  # the loop's part: buffer what the lane thread queued
        logger._seal(partial=True)
        t1 = time.thread_time()
        size = sum(_drive(logger._attempt(None, batch)) for batch in logger._outbox)  # type: ignore[arg-type]
        t2 = time.thread_time()
        best["log_record"] = min(best["log_record"], (t1 - t0) / n * 1e6)
        best["body"] = min(best["body"], (t2 - t1) / n * 1e6)
    return {**best, "total": best["log_record"] + best["body"], "bytes": size / n}


def compare(before: str, after: str, rounds: int) -> None:
    code = f"import sys, json; sys.path.insert(0, {str(HERE)!r}); " \
           "import bench_mlflow_record as b; print(json.dumps(b.measure()))"
    trees = {"before": before, "after": after}
    res: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    for _ in range(rounds):
        for name, src in trees.items():
            out = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": src},
                                 capture_output=True, text=True, check=True, timeout=600)
            res[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'us per record (10 metrics)':28}{'before med':>11}{'after med':>11}"
          f"{'after/before paired min/med/max':>34}")
    for key in res["after"][0]:
        b = [r[key] for r in res["before"]]
        a = [r[key] for r in res["after"]]
        ratios = [y / x for x, y in zip(b, a, strict=True)]
        print(f"{key:28}{statistics.median(b):11.2f}{statistics.median(a):11.2f}"
              f"{min(ratios):12.2f} / {statistics.median(ratios):.2f} / {max(ratios):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="the src/ folder of the old tree")
    parser.add_argument("--after", default=str(HERE.parent / "src"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.before:
        compare(args.before, args.after, args.rounds)
    else:
        print(json.dumps(measure()))


if __name__ == "__main__":
    main()
