"""How often the loop is woken, and how often each worker on the loop suspends, per batch.

    python benchmarks/investigations/loop_suspensions.py [--callbacks 10] [--valgrind]

Runs the suite's ``noop-async`` workload (``--callbacks`` callbacks with a no-op
``async def`` on each of the 12 per-batch events) through the suite's callgrind worker,
once with 10 and once with 30 batches a fit, and prints per batch the difference of the
two: the loop's wake-ups (``worker.hand_over_on_loop``), the workers' sleeps (a new
event from ``worker._event_factory``) and yields (``LoopHandle.yield_now``). With ``--valgrind`` the
runs go under ``valgrind --tool=none``, which serialises the threads as callgrind does: the
instruction rows of the suite are measured that way.

Why it matters: each suspension of a lane's task is a resume through asyncio's
``call_soon`` (about 13,000 instructions), so the count is most of what an ``async def``
call costs beyond the handler. Since ac8571c it is one per wake-up of the loop that brought
the lane work, whichever way the threads interleave: two a batch with the default barrier.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
ROOT = BENCH.parent

# Run in the worker's process: count, then run the worker as ``python -m harness.worker``.
PATCH = """
import atexit, collections, functools, os, runpy, sys
from trainbus.bus import bridge, producer, worker
counts = collections.Counter()
on_loop = worker.hand_over_on_loop
def counted_on_loop(*args):
    counts["wake-ups"] += 1
    return on_loop(*args)
producer.hand_over_on_loop = counted_on_loop
factory = worker._event_factory
def counted_factory(loop):
    new_event = factory(loop)
    def sleep():
        counts["sleeps"] += 1
        return new_event()
    return sleep
worker._event_factory = counted_factory
handle_init = bridge.LoopHandle.__init__
def counted_init(self):
    handle_init(self)
    yield_now = self.yield_now
    async def turn():
        counts["yields"] += 1
        await yield_now()
    self.yield_now = turn
bridge.LoopHandle.__init__ = counted_init
atexit.register(lambda: open(os.environ["COUNTS_OUT"], "w").write(repr(dict(counts))))
sys.argv = ["harness.worker", *sys.argv[1:]]
runpy.run_module("harness.worker", run_name="__main__")
"""


def run(batches: int, callbacks: int, valgrind: bool) -> dict[str, int]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "counts"
        config = f'[{{"scenario":"noop-async","n":{callbacks},"batches":[{batches},{batches}]}}]'
        command = [sys.executable, "-c", PATCH, "callgrind", "trainbus_fw", "--configs", config]
        if valgrind:
            command = ["valgrind", "--tool=none", "-q", *command]
        env = dict(os.environ, COUNTS_OUT=str(out), OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(BENCH)]))
        subprocess.run(command, cwd=BENCH, env=env, check=True, stdout=subprocess.DEVNULL)
        return ast.literal_eval(out.read_text())  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callbacks", type=int, default=10)
    parser.add_argument("--valgrind", action="store_true")
    args = parser.parse_args()
    few, many = (run(b, args.callbacks, args.valgrind) for b in (10, 30))
    batches = 2 * (30 - 10)  # the worker fits twice per config
    for key in ("wake-ups", "sleeps", "yields"):
        per_batch = (many.get(key, 0) - few.get(key, 0)) / batches
        print(f"{key:9} {per_batch:6.2f} a batch ({per_batch / args.callbacks:.2f} a lane)")


if __name__ == "__main__":
    main()
