"""Bytecodes the bus runs per no-op handler call, per function and thread: where the Python goes.

A ``sys.settrace`` opcode tracer (``frame.f_trace_opcodes``) on every thread counts the
bytecodes each function runs while the producer publishes ``bench_bus.py``'s 12 per-batch
events for ``--batches`` batches to ``--callbacks`` no-op callbacks of one kind (``sync``,
``async``, ``blocking``), or while plain code calls ``engine.run_event(BATCH_END)``
``--batches`` times (``--kind run_event``). Printed: bytecodes per handler call (per
``run_event`` call for that kind), in all and for the ``--top`` functions, with the thread that
ran them.

Tracing makes every call far slower, and the inline fast path decides by time, so the engine
is built with ``inline_max=1.0`` and deferred items wait up to a second (``DEFER_MAX``) instead
of 10 ms: every cheap handler stays on the fast path, as it does in a native run. Counts do not depend on the machine's load; like ``bench_instructions.py`` they
complement the timed benchmarks, they never replace them. Before and after a change, run it
against both trees (``PYTHONPATH=<tree>/src``).

Run:  python benchmarks/bench_opcodes.py [--kind async] [--callbacks 10] [--batches 100]
"""

from __future__ import annotations

import argparse
import collections
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import anyio  # noqa: E402
import bench_bus as bb  # noqa: E402

import trainbus.bus._inline as inline  # noqa: E402


def count(kind: str, callbacks: int, batches: int) -> tuple[int, collections.Counter[tuple[str, str, str]]]:
    """Run the scenario under the tracer; return (handler calls, bytecodes per function)."""
    inline.DEFER_MAX = inline.RECORD_DEFER_MAX = 1.0
    engine = bb.make_engine(callbacks, "sync" if kind == "run_event" else kind, inline_max=1.0)
    bus = engine._bus
    timer = engine.state._timer
    counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
    on = False

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode" and on:
            code = frame.f_code
            thread = threading.current_thread().name.split("-")[0:2]
            counts["-".join(thread), Path(code.co_filename).name, code.co_name] += 1
        return tracer

    def run(n: int) -> None:
        for _ in range(n):
            for burst in bb.BURSTS:
                if bb.E.BATCH_END in burst:
                    timer.on_batch_complete(64)
                bus.publish(*burst)

    def produce() -> None:
        nonlocal on
        run(30)
        bus.wait_all()
        on = True
        run(batches)
        bus.wait_all()
        on = False

    threading.settrace(tracer)
    sys.settrace(tracer)
    try:
        if kind == "run_event":
            for _ in range(200):
                engine.run_event(bb.E.BATCH_END)
            on = True
            for _ in range(batches):
                engine.run_event(bb.E.BATCH_END)
            on = False
            engine.close()
        else:
            anyio.run(engine.run_cycle, produce)
    finally:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]
    calls = batches if kind == "run_event" else batches * len(bb.PER_BATCH) * max(callbacks, 1)
    return calls, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="async", choices=["sync", "async", "blocking", "run_event"])
    parser.add_argument("--callbacks", type=int, default=10)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    calls, counts = count(args.kind, args.callbacks, args.batches)
    per = "run_event call" if args.kind == "run_event" else "handler call"
    print(f"{args.kind}, {args.callbacks} callbacks, {args.batches} batches: "
          f"{sum(counts.values()) / calls:.1f} bytecodes per {per}")
    for (thread, file, function), n in counts.most_common(args.top):
        print(f"{n / calls:9.1f}  {thread:<16} {file}:{function}")


if __name__ == "__main__":
    main()
