"""Unit tests of the bus's parts: the gate, a queue's counts and lags, the workers' edges.

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
from trainbus.bus import worker as worker_module
from trainbus.bus.counters import Counters
from trainbus.bus.members import Member
from trainbus.bus.queue import STOP, CallItem, EventItem, Gate, LogItem
from trainbus.bus.worker import Lane, Worker, hand_over_on_loop, wake_chain, wake_on_loop
from trainbus.core.bridge import LoopHandle
from trainbus.core.callback import resolve_callback
from trainbus.core.exceptions import Stopped
from trainbus.core.logger import LogRecord


class Plain(Callback):
    def batch_end(self, state: Any, logger: Any) -> None:
        return None


class Lagging(Callback):
    @trailing(2)
    async def batch_end(self, state: Any, logger: Any) -> None:
        return None


class NoLoop:
    """A loop handle for workers that never reach a loop (calls run at once)."""

    thread_id = -1
    asyncio_loop = None

    def call_soon_if_running(self, fn: Any, *args: Any) -> None:
        fn(*args)


def make_lane(callback: Callback | None = None, gate: Gate | None = None) -> Lane:
    member = Member(resolve_callback(callback or Plain()), 0, None, 0)
    return Lane(member, gate or Gate(Counters()))


def gate_of(lane: Lane) -> Gate:
    """The gate ``lane``'s counts report to."""
    gate: Gate = lane.records.reached.__self__  # type: ignore[attr-defined]
    return gate


def make_worker(*lanes: Lane, on_thread: bool = True, loop: Any = None) -> Worker:
    gate = gate_of(lanes[0])
    return Worker(lanes, on_thread, gate, gate.counters, loop or NoLoop(), None)  # type: ignore[arg-type]


def event_item(lane: Lane | None = None) -> EventItem:
    state = State(model=torch.nn.Linear(1, 1), max_duration="1ep")
    view = state.snapshot()
    return EventItem(Event.BATCH_END, view, Logger(state), 0, lane)


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
    worker = make_worker(make_lane())
    queue, gate = worker.queue, worker.gate
    gate.wait([(queue, 0)], "barrier")  # nothing to wait for
    assert queue.wait_done is None


def test_gate_wait_wakes_when_the_queue_counts_its_target() -> None:
    counters = Counters()
    worker = make_worker(make_lane(gate=Gate(counters)))
    queue, gate = worker.queue, worker.gate
    queue.enq = 2
    counted = threading.Event()

    def finish() -> None:
        queue.count_done(0, None)
        queue.count_done(0, None)
        counted.set()

    finisher = threading.Thread(target=finish)
    finisher.start()
    gate.wait([(queue, 2)], "barrier")
    finisher.join()
    assert counted.is_set() and queue.done == 2 and counters.barrier_waits <= 1


def test_gate_stop_unblocks_a_waiting_producer_with_stopped() -> None:
    worker = make_worker(make_lane())
    queue, gate = worker.queue, worker.gate
    queue.enq = 1
    stopper = threading.Thread(target=gate.stop)
    stopper.start()
    with pytest.raises(Stopped):
        gate.wait([(queue, 1)], "barrier")
    stopper.join()


def test_a_failing_handler_notes_the_handler_and_marks_its_lane_failed() -> None:
    lane = make_lane()
    make_worker(lane)
    error = ValueError("boom")
    lane.fail(error, lane.slots[Event.BATCH_END])
    gate = gate_of(lane)
    assert gate.stopping and lane.failed and gate.errors == [error]
    assert error.__notes__ == ["raised by Plain.batch_end while handling Event.BATCH_END"]


def test_a_wait_skips_an_abandoned_queue() -> None:
    worker = make_worker(make_lane())
    queue, gate = worker.queue, worker.gate
    queue.enq = 1
    queue.abandoned = True
    gate.wait([(queue, 1)], "barrier")  # returns: nobody waits for an abandoned queue


def test_the_wait_is_the_doing_of_whose_item_ended_it() -> None:
    counters = Counters()
    lane = make_lane(gate=Gate(counters))
    worker = make_worker(lane)
    queue, gate = worker.queue, worker.gate
    queue.enq = 1

    def finish() -> None:  # once the training thread waits for it
        while not gate._waiting:
            threading.Event().wait(0.001)
        queue.count_done(0, lane.member)

    finisher = threading.Thread(target=finish)
    finisher.start()
    gate.wait([(queue, 1)], "barrier")
    finisher.join()
    assert lane.member.wait_caused > 0.0 and gate._last is None


# -- lags ------------------------------------------------------------------------------------


def test_a_trailing_handler_is_waited_for_only_k_batches_later() -> None:
    queue = make_worker(make_lane(Lagging()), on_thread=False).queue
    assert not queue.uniform
    for batch in range(1, 5):
        queue.put_event(event_item(), 2, False)
        queue.mark_batch_end(batch)
        # the barrier of batch n waits for the items of batch n - 2
        assert queue.barrier_target(batch) == max(batch - 2, 0)
    assert queue.last_fenced == 0  # a declared @trailing item: not for the live fence


def test_a_worker_on_the_loop_keeps_the_publishing_threads_items_until_a_hand_over() -> None:
    worker = make_worker(make_lane(Lagging()), on_thread=False)
    worker.queue.put_event(event_item(), 0, True)
    assert list(worker.queue.items) == [] and len(worker.queue.inbox) == 1
    thread = make_worker(make_lane())
    thread.queue.put_event(event_item(), 0, True)
    assert thread.queue.inbox is thread.queue.items and len(thread.queue.items) == 1


# -- records ---------------------------------------------------------------------------------


def test_wait_for_room_returns_once_a_record_is_taken() -> None:
    records = make_lane().records
    records.bound = 3
    for _ in range(3):
        records.count()
    taken = threading.Thread(target=records.count_done)
    taken.start()
    records.wait_for_room(give_up=lambda: False)  # 2 wait now: room for one more
    taken.join()
    assert records.enq - records.done == 2


# -- the wake-up chain of the lane threads ---------------------------------------------------


class NotedWorker(Worker):
    """A thread worker whose wake-ups are noted, in order, by name (no OS thread: the test
    plays it)."""

    woken: list[str]

    def wake(self) -> None:
        self.woken.append(self.name)


def sleeping_threads(n: int) -> tuple[list[Worker], list[str]]:
    """``n`` thread workers that sleep with work queued, chained as ``place`` chains them."""
    woken: list[str] = []
    threads: list[Worker] = []
    wakes = [0]
    for k in range(n):
        lane = make_lane()
        thread = NotedWorker([lane], True, gate_of(lane), Counters(), NoLoop(), None)  # type: ignore[arg-type]
        thread.name, thread.woken = f"T{k}", woken
        thread.queue.items.append(event_item())
        thread.idle = True
        threads.append(thread)
    for k, thread in enumerate(threads):
        thread.chain, thread.place, thread.wakes = threads, k, wakes
    return threads, woken


def start(threads: list[Worker]) -> None:
    """What ``Producer.wake_threads`` does."""
    threads[0].wakes[0] += 1
    wake_chain(threads)


def leaves_its_sleep(thread: Worker) -> None:
    """What a woken thread does (``Worker.sleep`` returning): with work queued, it does
    not block, then passes the chain's wake-up on."""
    thread.sleep()


def test_the_producer_wakes_one_thread_and_each_woken_thread_wakes_the_next() -> None:
    threads, woken = sleeping_threads(4)
    start(threads)
    assert woken == ["T0"]  # the training thread's one wake-up
    for k, thread in enumerate(threads[:-1]):
        leaves_its_sleep(thread)
        assert woken[-1] == f"T{k + 1}"  # before T<k> runs anything, it wakes T<k+1>
    leaves_its_sleep(threads[-1])
    assert woken == ["T0", "T1", "T2", "T3"]  # every thread with work, each once


def test_the_chain_passes_over_running_threads_and_threads_with_nothing_queued() -> None:
    threads, woken = sleeping_threads(4)
    threads[1].idle = False  # running: it takes what is queued without a wake-up
    threads[2].queue.items.clear()  # nothing to run
    start(threads)
    leaves_its_sleep(threads[0])
    assert woken == ["T0", "T3"]


def test_a_thread_woken_for_its_own_item_passes_nothing_on() -> None:
    # A record or a close call wakes its own thread (``put``); the other threads' items wait
    # for the producer's next wake-up, as the rule inside a batch says.
    threads, woken = sleeping_threads(3)
    start(threads)
    for thread in threads:
        leaves_its_sleep(thread)
    del woken[:]
    threads[2].idle = True  # T2 sleeps again with work (a batch's items)
    leaves_its_sleep(threads[0])  # T0 woken by a put: no wake-up of the chain to pass on
    assert woken == []
    start(threads)
    assert woken == ["T2"]


# -- a lane thread after an internal error ---------------------------------------------------


def test_a_broken_lane_thread_counts_events_and_records_fails_calls_and_stops() -> None:
    lane, other = make_lane(), make_lane()
    thread = make_worker(lane, other)
    thread.subs[Event.BATCH_END] = [(lane, lane.slots[Event.BATCH_END]),
                                    (other, other.slots[Event.BATCH_END])]
    calls: list[BaseException | None] = []
    record = LogRecord({"x": 1.0}, 0, 0.0)
    thread.queue.put_event(event_item(), 0, True)  # every callback of the thread's
    thread.queue.put_event(event_item(lane), 0, True)  # lane's own
    lane.records.count()
    thread.put(LogItem(record, lane))
    thread.put(CallItem(lambda: None, False, calls.append, lane))
    thread.put(STOP)
    error = RuntimeError("internal")
    thread.drain_failed(error)
    assert (thread.queue.done, lane.records.done) == (2, 1)
    assert lane.worker is other.worker is thread
    assert calls == [error]


# -- a worker's suspensions on the loop ------------------------------------------------------


class Awaiting(Callback):
    async def batch_end(self, state: Any, logger: Any) -> None:
        return None


@pytest.mark.anyio
async def test_a_worker_on_the_loop_suspends_once_per_hand_over_however_they_interleave(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What a worker on the loop costs must not depend on how the threads interleave: two
    # hand-overs that reach the loop before its task runs cost it two suspensions (a yield,
    # then a sleep), as two that come while it sleeps do (two sleeps).
    lane = make_lane(Awaiting())
    loop = LoopHandle()
    worker = make_worker(lane, on_thread=False, loop=loop)
    counters = worker.counters
    seen: list[str] = []
    yield_now = loop.yield_now

    async def counted_yield() -> None:
        seen.append("yield")
        await yield_now()

    loop.yield_now = counted_yield
    factory = worker_module._event_factory

    def counted_factory(handle: Any) -> Any:
        new_event = factory(handle)

        def counted_event() -> Any:
            seen.append("sleep")
            return new_event()

        return counted_event

    monkeypatch.setattr(worker_module, "_event_factory", counted_factory)

    async def settled(done: int) -> None:  # the worker ran `done` items and sleeps
        while not (worker.queue.done == done and worker.idle):
            await anyio.lowlevel.checkpoint()

    def hand_over() -> None:  # what Producer.hand_over hands the loop: one item
        worker.queue.enq += 1
        hand_over_on_loop([(worker, [event_item()])], counters)

    finished = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run_task, finished)
        await settled(0)
        start_at = len(seen)
        hand_over()
        hand_over()  # before the task has run: it finds both
        await settled(2)
        together = seen[start_at:]
        start_at = len(seen)
        hand_over()
        await settled(3)
        hand_over()
        await settled(4)
        apart = seen[start_at:]
        worker.queue.items.append(STOP)
        wake_on_loop([worker], counters)
        await finished.wait()
    assert together == ["yield", "sleep"]
    assert apart == ["sleep", "sleep"]
    assert lane.member.slots[Event.BATCH_END].calls == 4
    assert counters.loop_wakeups == 5


def test_a_stop_that_unwinds_a_handler_is_not_recorded_as_its_error() -> None:
    """A handler that waited inside (for a destination's room, say) while the session
    stopped for another handler's error gets ``Stopped``: the bus unwinding it. Only the
    first error is the run's."""
    gate = Gate(Counters())
    boom = RuntimeError("boom")
    gate.fail(boom, None, None)
    gate.fail(Stopped(), None, None)
    assert gate.errors == [boom]
