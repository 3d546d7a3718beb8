"""Unit tests of the bus's parts: the gate, a lane's counts and lags, the runners' edges.

The guarantee tests (``test_d*.py``) drive whole runs; these pin the protocols those runs
rest on, one at a time, so that a broken invariant fails here with a name instead of as a
rare hang there.
"""

from __future__ import annotations

import threading
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import torch

from trainbus import Callback, Event, Logger, State, blocking, trailing
from trainbus.bus.bridge import LoopHandle, LoopWaker
from trainbus.bus.lanes import STOP, CallItem, Counters, EventItem, Gate, Lane, LogItem, Stopped
from trainbus.bus.members import Member
from trainbus.bus.pool import LaneThread, WakeChain
from trainbus.bus.runners import fail_lane_thread, run_loop_lane
from trainbus.core.callback import resolve_callback
from trainbus.core.logger import LogRecord


class Plain(Callback):
    def batch_end(self, state: Any, logger: Any) -> None:
        return None


class Lagging(Callback):
    @trailing(2)
    async def batch_end(self, state: Any, logger: Any) -> None:
        return None


def make_lane(callback: Callback | None = None, gate: Gate | None = None) -> Lane:
    member = Member(resolve_callback(callback or Plain()), 0, None, 0)
    return Lane(member, gate or Gate(Counters()))


def event_item() -> EventItem:
    state = State(model=torch.nn.Linear(1, 1), max_duration="1ep")
    view = state.snapshot()
    return EventItem(Event.BATCH_END, view, Logger(state), 0)


# -- placement, declared -----------------------------------------------------------------


class AsyncOnly(Callback):
    async def batch_end(self, state: Any, logger: Any) -> None:
        return None


class Lockstep(Callback):
    @blocking
    def after_train_batch(self, state: Any, logger: Any) -> None:
        return None


@pytest.mark.parametrize(
    ("callback", "on_thread"),
    [(Plain(), True), (AsyncOnly(), False), (Lockstep(), False)],
    ids=["plain", "async-only", "blocking-only"],
)
def test_placement_follows_from_the_declarations_alone(callback: Callback, on_thread: bool) -> None:
    assert make_lane(callback).on_thread is on_thread


# -- the gate ------------------------------------------------------------------------------


def test_gate_wait_returns_at_once_when_every_target_is_reached() -> None:
    lane = make_lane()
    lane.gate.wait([(lane.counts, 0)], "barrier")  # nothing to wait for
    assert lane.counts.wait_done is None


def test_gate_wait_wakes_when_the_lane_counts_its_target() -> None:
    counters = Counters()
    lane = make_lane(gate=Gate(counters))
    lane.counts.enq = 2
    counted = threading.Event()

    def finish() -> None:
        lane.counts.count_done(lane)
        lane.counts.count_done(lane)
        counted.set()

    finisher = threading.Thread(target=finish)
    finisher.start()
    lane.gate.wait([(lane.counts, 2)], "barrier")
    finisher.join()
    assert counted.is_set() and lane.counts.done == 2 and counters.barrier_waits <= 1


def test_gate_stop_unblocks_a_waiting_producer_with_stopped() -> None:
    lane = make_lane()
    lane.counts.enq = 1
    stopper = threading.Thread(target=lane.gate.stop)
    stopper.start()
    with pytest.raises(Stopped):
        lane.gate.wait([(lane.counts, 1)], "barrier")
    stopper.join()


def test_gate_fail_notes_the_handler_and_marks_its_lane_failed() -> None:
    lane = make_lane()
    handler = lane.member.table.handlers[Event.BATCH_END]
    error = ValueError("boom")
    lane.gate.fail(error, handler, Event.BATCH_END, lane)
    assert lane.gate.stopping and lane.failed and lane.gate.errors == [error]
    assert error.__notes__ == ["raised by Plain.batch_end while handling Event.BATCH_END"]


def test_a_wait_skips_an_abandoned_lane() -> None:
    lane = make_lane()
    lane.counts.enq = 1
    lane.counts.abandoned = True
    lane.gate.wait([(lane.counts, 1)], "barrier")  # returns: nobody waits for an abandoned lane


# -- lags ------------------------------------------------------------------------------------


def test_a_trailing_lane_is_waited_for_only_k_batches_later() -> None:
    lane = make_lane(Lagging())
    counts = lane.counts
    assert not lane.uniform and not counts.uniform
    for batch in range(1, 5):
        counts.enq += 1
        counts.last_by_lag[2] = counts.enq
        counts.mark_batch_end(batch)
        # the barrier of batch n waits for the items of batch n - 2
        assert counts.barrier_target(batch) == max(batch - 2, 0)


# -- records ---------------------------------------------------------------------------------


def test_wait_for_room_returns_once_a_record_is_taken() -> None:
    lane = make_lane()
    for _ in range(3):
        lane.count_record()
    taken = threading.Thread(target=lane.count_log_done)
    taken.start()
    lane.wait_for_room(3, give_up=lambda: False)  # 2 wait now: room for one more
    taken.join()
    assert lane.log_enq - lane.log_done == 2


# -- the wake-up chain of the lane threads ---------------------------------------------------


class NotedThread(LaneThread):
    """A lane thread whose wake-ups are noted, in order, by name (no OS thread: the test
    plays it)."""

    def __init__(self, name: str, woken: list[str]) -> None:
        super().__init__([make_lane()])
        self.name = name
        self.woken = woken

    def wake(self) -> None:
        self.woken.append(self.name)


def sleeping_threads(n: int) -> tuple[list[LaneThread], list[str], WakeChain]:
    """``n`` lane threads that sleep with work queued, and their chain."""
    woken: list[str] = []
    threads: list[LaneThread] = []
    for k in range(n):
        thread = NotedThread(f"T{k}", woken)
        thread.pending.append(event_item())
        thread.idle = True
        threads.append(thread)
    return threads, woken, WakeChain(threads)


def leaves_its_sleep(thread: LaneThread) -> None:
    """What a woken thread does (``LaneThread.sleep`` returning): with work queued, it does
    not block, then passes the chain's wake-up on."""
    thread.sleep()


def test_the_producer_wakes_one_thread_and_each_woken_thread_wakes_the_next() -> None:
    threads, woken, chain = sleeping_threads(4)
    chain.start()
    assert woken == ["T0"]  # the training thread's one wake-up
    for k, thread in enumerate(threads[:-1]):
        leaves_its_sleep(thread)
        assert woken[-1] == f"T{k + 1}"  # before T<k> runs anything, it wakes T<k+1>
    leaves_its_sleep(threads[-1])
    assert woken == ["T0", "T1", "T2", "T3"]  # every thread with work, each once


def test_the_chain_passes_over_running_threads_and_threads_with_nothing_queued() -> None:
    threads, woken, chain = sleeping_threads(4)
    threads[1].idle = False  # running: it takes what is queued without a wake-up
    threads[2].pending.clear()  # nothing to run
    chain.start()
    leaves_its_sleep(threads[0])
    assert woken == ["T0", "T3"]


def test_a_thread_woken_for_its_own_item_passes_nothing_on() -> None:
    # A record or a close call wakes its own thread (``put``); the other threads' items wait
    # for the producer's next wake-up, as the rule inside a batch says.
    threads, woken, chain = sleeping_threads(3)
    chain.start()
    for thread in threads:
        leaves_its_sleep(thread)
    del woken[:]
    threads[2].idle = True  # T2 sleeps again with work (a batch's items)
    leaves_its_sleep(threads[0])  # T0 woken by a put: no wake-up of the chain to pass on
    assert woken == []
    chain.start()
    assert woken == ["T2"]


# -- a thread lane after an internal error ---------------------------------------------------


def test_a_broken_lane_thread_counts_events_and_records_fails_calls_and_stops() -> None:
    lane, other = make_lane(), make_lane()
    thread = LaneThread([lane, other])
    thread.subs[Event.BATCH_END] = [(lane, lane.slots[Event.BATCH_END]),
                                    (other, other.slots[Event.BATCH_END])]
    calls: list[BaseException | None] = []

    class Loop:
        def call_soon_if_running(self, fn: Any, *args: Any) -> None:
            fn(*args)

    record = LogRecord({"x": 1.0}, 0, 0.0)
    thread.pending.append(event_item())  # a bare item: every callback of the thread's
    thread.put(lane, event_item())
    thread.put(lane, LogItem(record))
    thread.put(lane, CallItem(lambda: None, False, calls.append))
    thread.stop()
    thread.counts.enq = 2  # the bare item and lane's own: one count for the thread's FIFO
    lane.log_enq = 1
    error = RuntimeError("internal")
    fail_lane_thread(thread, Loop(), error)  # type: ignore[arg-type]
    assert (thread.counts.done, lane.log_done) == (2, 1)
    assert lane.counts is other.counts is thread.counts
    assert calls == [error]


# -- a loop lane's suspensions -------------------------------------------------------------


class Awaiting(Callback):
    async def batch_end(self, state: Any, logger: Any) -> None:
        return None


@pytest.mark.anyio
async def test_a_loop_lane_suspends_once_per_wake_up_however_they_interleave() -> None:
    # What a loop lane costs must not depend on how the threads interleave: two wake-ups
    # that reach the loop before the lane's task runs cost it two suspensions (a yield,
    # then a sleep), as two that come while it sleeps do (two sleeps).
    lane = make_lane(Awaiting())
    counters = Counters()
    loop = LoopHandle()
    seen: list[str] = []
    new_event, yield_now = loop.new_event, loop.yield_now

    def counted_event() -> Any:
        seen.append("sleep")
        return new_event()

    async def counted_yield() -> None:
        seen.append("yield")
        await yield_now()

    loop.new_event, loop.yield_now = counted_event, counted_yield
    waker = LoopWaker(loop, counters)

    async def settled(done: int) -> None:  # the lane ran `done` items and sleeps
        while not (lane.counts.done == done and lane.idle):
            await anyio.lowlevel.checkpoint()

    def wake_up() -> None:  # what Producer.hand_over hands the loop: one item
        lane.counts.enq += 1
        waker._on_loop([(lane, [event_item()])])

    finished = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(run_loop_lane, lane, counters, loop, finished)
        await settled(0)
        start = len(seen)
        wake_up()
        wake_up()  # before the lane's task has run: it finds both
        await settled(2)
        together = seen[start:]
        start = len(seen)
        wake_up()
        await settled(3)
        wake_up()
        await settled(4)
        apart = seen[start:]
        lane.pending.append(STOP)
        waker.wake([lane])
        await finished.wait()
    assert together == ["yield", "sleep"]
    assert apart == ["sleep", "sleep"]
    assert lane.member.slots[Event.BATCH_END].calls == 4


def test_a_stop_that_unwinds_a_handler_is_not_recorded_as_its_error() -> None:
    """A handler that waited inside (for a destination's room, say) while the session
    stopped for another handler's error gets ``Stopped``: the bus unwinding it. Only the
    first error is the run's (a hypothesis run under Python 3.13 found the second one
    reported as a failure of the waiting handler)."""
    gate = Gate(Counters())
    lane, other = make_lane(gate=gate), make_lane(gate=gate)
    boom = RuntimeError("boom")
    gate.fail(boom, None, None, other)
    gate.fail(Stopped(), None, None, lane)
    assert gate.errors == [boom]
    assert other.failed and not lane.failed
