"""benchmarks/bench_async_floor.py: the bare round trip runs every handler, once per batch."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_async_floor  # noqa: E402


def test_the_floor_runs_each_events_handlers_in_one_round_trip_a_batch() -> None:
    loop = bench_async_floor.LoopThread()
    seen: list[int] = []

    class Counting:
        async def handler(self, state: object, logger: object) -> None:
            seen.append(1)

    try:
        loop.per_event = [[Counting().handler] * 3] * bench_async_floor.EVENTS
        loop.round_trip(list(range(bench_async_floor.EVENTS)))
        assert len(seen) == 3 * bench_async_floor.EVENTS  # all ran before the answer came
        loop.round_trip([])  # the bare round trip: nothing runs, the answer still comes
        assert len(seen) == 3 * bench_async_floor.EVENTS
    finally:
        loop.close()
    assert not loop.thread.is_alive()
