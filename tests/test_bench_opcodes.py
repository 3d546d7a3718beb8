"""benchmarks/bench_opcodes.py: the opcode tracer counts the bus's own functions, per thread."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_opcodes  # noqa: E402


def test_async_calls_are_counted_on_the_loop_and_the_training_thread() -> None:
    calls, counts = bench_opcodes.count("async", callbacks=2, batches=3)
    assert calls == 3 * 12 * 2
    by_function = {(thread, function): n for (thread, _, function), n in counts.items()}
    # The loop drains the lanes; the training thread offers each event to them.
    assert by_function[("MainThread", "_drain_eagerly")] > 0
    assert by_function[("trainbus-train", "_offer")] > 0
    # Every handler ran on the loop (12 events x 2 callbacks x 3 batches, 2 bytecodes each
    # at least: the no-op's RETURN_VALUE and its LOAD_CONST).
    assert by_function[("MainThread", "handler")] >= 2 * calls


def test_run_event_counts_per_call() -> None:
    calls, counts = bench_opcodes.count("run_event", callbacks=3, batches=5)
    assert calls == 5
    assert any(function == "run_here" for (_, _, function) in counts)
