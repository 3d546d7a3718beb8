"""Where the training thread waits with the callbacks users turn on: each wait at the gate,
by kind, event and what it waited for (a count, and the seconds it lasted).

    python benchmarks/investigations/users_callbacks_waits.py [--workload g10] [--batches 300]
    TRAINBUS_SRC=/tmp/old/src python benchmarks/investigations/users_callbacks_waits.py

The trainbus arm of ``suite/_users_callbacks_arms.py`` (progress output, JSON-lines,
TensorBoard, LR and throughput monitors, a checkpoint every 50 batches), one fit, with
``Gate.wait`` wrapped to note each wait that blocks: its kind (barrier, live fence, records,
backpressure, ``@blocking``), its event, and the workers' queues (``Q:``) or destinations'
records (``R:``) not yet done. The count of waits is decided by the rules (what a barrier or
the fence waits for), not by the machine; how long each lasts is wall clock. For trees from
the bus's redesign on (``bus/queue.py``'s ``Gate``, ``bus/worker.py``'s ``Worker``).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1]
sys.path[:0] = [os.environ.get("TRAINBUS_SRC", str(BENCH.parent / "src")), str(BENCH)]

from harness import workload as wl  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="g10", choices=sorted(wl.WORKLOADS))
    parser.add_argument("--batches", type=int, default=300)
    args = parser.parse_args()

    from trainbus.bus import queue, worker

    waits: dict[tuple[str, str, tuple[str, ...]], list[float]] = collections.defaultdict(list)
    names: dict[int, str] = {}
    wait, init = queue.Gate.wait, worker.Worker.__init__

    def noted_wait(self: Any, targets: Any, kind: str, event: Any = None) -> None:
        behind = tuple(sorted(names.get(id(w), "?") for w, target in targets if w.done < target))
        t0 = time.perf_counter()
        try:
            wait(self, targets, kind, event)
        finally:
            if behind:
                key = (kind, event.name if event is not None else "-", behind)
                waits[key].append(time.perf_counter() - t0)

    def named_init(self: Any, lanes: Any, *more: Any, **kw: Any) -> None:
        init(self, lanes, *more, **kw)
        names[id(self.queue)] = "Q:" + "+".join(lane.name for lane in lanes)
        for lane in lanes:
            names[id(lane.records)] = "R:" + lane.name

    queue.Gate.wait = noted_wait  # type: ignore[method-assign]
    worker.Worker.__init__ = named_init  # type: ignore[method-assign]

    from suite import _users_callbacks_arms as arms

    w = wl.make_workload(args.workload, args.batches)
    with tempfile.TemporaryDirectory() as tmp:
        arms.trainbus(w, wl.TimedBatches(w.batches[: args.batches]), Path(tmp), True)
    print(f"\nwaits of the training thread ({args.batches} batches of {args.workload}):")
    for (kind, event, behind), seconds in sorted(waits.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {len(seconds):5d} x {kind:12s} {event:20s} {sum(seconds) * 1e3:8.1f} ms  "
              f"behind {', '.join(behind)}")


if __name__ == "__main__":
    main()
