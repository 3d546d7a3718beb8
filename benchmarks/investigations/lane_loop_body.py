"""What a lane thread's loop costs a no-op plain call, alone (issue 42's row (c)).

    python benchmarks/investigations/lane_loop_body.py

The loop body of ``bus/worker.Worker.run_thread`` over an event item's handlers, rebuilt
with plain ``__slots__`` classes (no bus, no threads, no GIL hand-over), timed with timeit
over 100 handlers: the bare call; the call with the lane's counts; with ``slot.calls`` too;
the whole body (the clock read and the statistics). Compare with
``investigations/lane_pool.py`` (the same calls in a fit): the difference is what the
threads' hand-overs cost, not the loop. Minimum of 7 repeats of 200 rounds, ns a call.
"""

from __future__ import annotations

import time
import timeit
from collections.abc import Callable
from typing import Any

_perf = time.perf_counter
Sub = tuple["Lane", "Slot", Callable[[Any, Any], None]]


class Member:
    __slots__ = ("peak",)


class Lane:
    __slots__ = ("current", "done", "enq", "last_batch", "member", "wait_done")


class Slot:
    __slots__ = ("calls", "max_time", "qualname", "total_time")


class NoOp:
    def handler(self, state: Any, logger: Any) -> None:
        return None


def make(n: int) -> list[Sub]:
    subs: list[Sub] = []
    for _ in range(n):
        member = Member()
        member.peak = 0
        lane = Lane()
        lane.current, lane.done, lane.enq, lane.last_batch = None, 0, 10**9, 0
        lane.member, lane.wait_done = member, None
        slot = Slot()
        slot.calls, slot.total_time, slot.max_time, slot.qualname = 0, 0.0, 0.0, "NoOp.h"
        subs.append((lane, slot, NoOp().handler))
    return subs


def bare(subs: list[Sub]) -> None:
    for _lane, _slot, fn in subs:
        fn(None, None)


def counts(subs: list[Sub], batch: int = 1) -> None:
    for lane, slot, fn in subs:
        lane.current = slot.qualname
        try:
            fn(None, None)
        except BaseException:
            pass
        lane.current = None
        lane.last_batch = batch
        done = lane.done
        depth = lane.enq - done
        member = lane.member
        if depth > member.peak:
            member.peak = depth
        lane.done = done = done + 1
        target = lane.wait_done
        if target is not None and done >= target:
            pass


def counts_and_calls(subs: list[Sub], batch: int = 1) -> None:
    for lane, slot, fn in subs:
        lane.current = slot.qualname
        try:
            fn(None, None)
        except BaseException:
            pass
        lane.current = None
        slot.calls += 1
        lane.last_batch = batch
        done = lane.done
        depth = lane.enq - done
        member = lane.member
        if depth > member.peak:
            member.peak = depth
        lane.done = done = done + 1
        target = lane.wait_done
        if target is not None and done >= target:
            pass


def whole(subs: list[Sub], batch: int = 1) -> None:
    t0 = _perf()
    for lane, slot, fn in subs:
        lane.current = slot.qualname
        try:
            fn(None, None)
        except BaseException:
            pass
        t1 = _perf()
        lane.current = None
        elapsed = t1 - t0
        slot.calls += 1
        slot.total_time += elapsed
        if elapsed > slot.max_time:
            slot.max_time = elapsed
        lane.last_batch = batch
        done = lane.done
        depth = lane.enq - done
        member = lane.member
        if depth > member.peak:
            member.peak = depth
        lane.done = done = done + 1
        target = lane.wait_done
        if target is not None and done >= target:
            pass
        t0 = t1


def main() -> None:
    subs = make(100)
    for _ in range(2):
        for body in (bare, counts, counts_and_calls, whole):
            best = min(timeit.repeat(lambda body=body: body(subs), number=200, repeat=7))
            print(f"{body.__name__:>17}: {best / 200 / len(subs) * 1e9:4.0f} ns a call")


if __name__ == "__main__":
    main()
