"""Instructions per no-op handler call, counted by valgrind's callgrind: a figure that does
not move with the machine's load (wall-clock figures here move 2-5x between runs).

Each configuration runs in its own process under ``valgrind --tool=callgrind`` with
instrumentation off until the measured region (``callgrind_control -i on``), so only that
region is counted, on every thread (the training thread, the event loop, lane threads):

* trainbus: the producer publishes the 12 per-batch events of ``bench_bus.py`` for
  ``--batches`` batches, to 10 no-op callbacks of a kind (plain, ``async def``,
  ``@blocking``) or to none, then waits for every handler; per call =
  (instructions with 10 callbacks - with none) / (batches * 120 calls).
* ``engine.run_event()`` from plain code (``--kinds run_event``): instructions per call
  with no callbacks and with 10 no-op plain ones, the way Composer users unit-test them.
* Ignite (its venv, ``benchmarks/.venvs/ignite``): an ``Engine`` whose step does nothing
  runs ``--batches`` iterations with 10 no-op handlers on each of its 4 per-iteration
  events, or none; per call = difference / (batches * 40 calls).

The inline fast path decides by time (a handler's calls under ``inline_max``, deferred
items woken after ``DEFER_MAX``); under valgrind, ~50x slower, both limits are scaled by 50
so that it decides as it does natively.

CPU instructions are not seconds (a thread hand-off's wait costs time, not instructions;
a cache miss costs time at equal counts), so this complements, never replaces, the timed
benchmarks: it shows what the code itself costs per call, reproducibly.

Run:  python benchmarks/bench_instructions.py [--before <src of another tree>] [--batches 200]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
IGNITE_PY = HERE / ".venvs" / "ignite" / "bin" / "python"

TRAINBUS_CHILD = r'''
import os, subprocess, sys
sys.path.insert(0, {bench!r})
import anyio
import bench_bus as bb
import trainbus.bus._inline as inline
n, kind, batches = {n}, {kind!r}, {batches}
# Under valgrind everything runs ~50x slower; the fast path's time limits are scaled alike,
# so that it decides as in a native run (else every handler looks slow and goes to its thread).
inline.DEFER_MAX = inline.RECORD_DEFER_MAX = 50 * inline.DEFER_MAX
engine = bb.make_engine(n, kind, inline_max=50 * 50e-6)
bus = engine._bus
timer = engine.state._timer
def ctl(*args):
    subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True,
                   capture_output=True)
def run(count):
    for _ in range(count):
        for burst in bb.BURSTS:
            if bb.E.BATCH_END in burst:
                timer.on_batch_complete(64)
            bus.publish(*burst)
    bus.wait_all()
def produce():
    run(30)  # warm-up: the inline fast path learns which handlers are cheap
    ctl("-i", "on")
    run(batches)
    ctl("-i", "off")
    ctl("-d")
anyio.run(engine.run_cycle, produce)
'''

RUN_EVENT_CHILD = r'''
import os, subprocess, sys
sys.path.insert(0, {bench!r})
import bench_bus as bb
engine = bb.make_engine({n}, "sync")
def ctl(*args):
    subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True,
                   capture_output=True)
for _ in range(30):  # the standing session starts; the handlers are learnt cheap
    engine.run_event(bb.E.BATCH_START)
ctl("-i", "on")
for _ in range({batches}):
    engine.run_event(bb.E.BATCH_START)
ctl("-i", "off")
ctl("-d")
engine.close()
'''

IGNITE_CHILD = r'''
import os, subprocess
from ignite.engine import Engine, Events
n, batches = {n}, {batches}
EVENTS = (Events.GET_BATCH_STARTED, Events.GET_BATCH_COMPLETED,
          Events.ITERATION_STARTED, Events.ITERATION_COMPLETED)
def noop(engine):
    return None
def ctl(*args):
    subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True,
                   capture_output=True)
def make():
    engine = Engine(lambda engine, batch: None)
    for _ in range(n):
        for event in EVENTS:
            engine.add_event_handler(event, noop)
    return engine
make().run(range(30), max_epochs=1)  # warm-up
engine = make()
data = range(batches)
engine.add_event_handler(Events.EPOCH_STARTED, lambda e: ctl("-i", "on"))
engine.add_event_handler(Events.EPOCH_COMPLETED, lambda e: ctl("-i", "off"))
engine.run(data, max_epochs=1)
ctl("-d")
'''


def count(python: str, code: str, env: dict[str, str]) -> int:
    """Instructions of the measured region of ``code`` run by ``python`` under callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        script = Path(tmp) / "child.py"
        script.write_text(code)
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={out}", python, str(script)],
            env=env, capture_output=True, text=True, timeout=1800,
        )
        dumps = sorted(Path(tmp).glob("cg.out.*"))
        if proc.returncode or not dumps:
            raise SystemExit(f"callgrind run failed:\n{proc.stderr[-3000:]}")
        match = re.search(r"^totals: (\d+)", dumps[0].read_text(), re.M)
        assert match is not None
        return int(match.group(1))


def real_python(python: str) -> str:
    """The interpreter itself, not a pyenv shim (valgrind would measure the shim)."""
    out = subprocess.run([python, "-c", "import sys; print(sys.executable)"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def trainbus_row(src: str, kind: str, batches: int) -> float:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    py = real_python(sys.executable)
    fill = {"bench": str(HERE), "batches": batches}
    base = count(py, TRAINBUS_CHILD.format(n=0, kind="sync", **fill), env)
    ten = count(py, TRAINBUS_CHILD.format(n=10, kind=kind, **fill), env)
    return (ten - base) / (batches * 120)


def run_event_row(src: str, calls: int) -> tuple[float, float]:
    """Instructions per ``engine.run_event()`` from plain code: no callbacks, 10 no-op ones."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    py = real_python(sys.executable)
    fill = {"bench": str(HERE), "batches": calls}
    none = count(py, RUN_EVENT_CHILD.format(n=0, **fill), env)
    ten = count(py, RUN_EVENT_CHILD.format(n=10, **fill), env)
    return none / calls, ten / calls


def ignite_row(batches: int) -> float:
    env = {"PATH": os.environ["PATH"], "OMP_NUM_THREADS": "1"}
    py = real_python(str(IGNITE_PY))
    base = count(py, IGNITE_CHILD.format(n=0, batches=batches), env)
    ten = count(py, IGNITE_CHILD.format(n=10, batches=batches), env)
    return (ten - base) / (batches * 40)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--before", help="the src/ folder of another tree, measured too")
    parser.add_argument("--kinds", default="blocking,async,sync,run_event",
                        help="handler kinds, and run_event (per engine.run_event() call)")
    args = parser.parse_args()
    trees = {"this tree": str(HERE.parent / "src")}
    if args.before:
        trees = {"before": args.before, **trees}
    print(f"{'handler kind':14} {'tree':10} {'instructions per no-op call':>28}")
    for kind in args.kinds.split(","):
        for name, src in trees.items():
            if kind == "run_event":
                none, ten = run_event_row(src, args.batches * 10)
                print(f"{'run_event, 0':14} {name:10} {none:28,.0f}\n"
                      f"{'run_event, 10':14} {name:10} {ten:28,.0f}", flush=True)
                continue
            per_call = trainbus_row(src, kind, args.batches)
            print(f"{kind:14} {name:10} {per_call:28,.0f}", flush=True)
    if IGNITE_PY.exists():
        print(f"{'ignite':14} {'(venv)':10} {ignite_row(args.batches):28,.0f}", flush=True)
    else:
        print("ignite: no venv (bash benchmarks/setup_peers.sh)")


if __name__ == "__main__":
    main()
