"""Who runs a lane's items: a lane thread, or the lane's task on the event loop.

Placement is declared (``members.py``) and fixed for the run:

- :func:`run_lane_thread` is the body of a lane thread (``pool.LaneThread``), which serves
  the callbacks pinned to it. It takes entries from its FIFO (sleeping in
  ``LaneThread.sleep`` when there are none) and runs each: plain handlers right here;
  ``async def`` ones on the loop, handed over through the
  :class:`~trainbus.bus.bridge.Spawner` and waited for, so each callback's handlers stay
  in order (D1) and its plain ones always run on this one thread. A callback's item runs
  under its lane's lock only when the training thread runs some of the callback's
  handlers too (``Member.shares_thread``).
- :func:`run_loop_lane` is a loop lane's task, an ordinary anyio task in the session's
  task group: it awaits each item's handler in turn and sleeps on ``lane.wakeup`` when the
  lane is empty.

The two take the same items and treat them alike: an event item of a stopping session
is counted without being run (D10, :func:`_skipped`); a record goes to a destination that
has not failed; a call item's ``on_done`` hears its error. A lossy destination's marker
(``mailbox.py``) delivers the records waiting in its mailbox, at most ``limit + 1`` takes
(then the marker goes to the back of the lane's queue, so that records logged without
pause from other threads never starve the lane's events); the records it dropped or
merged are counted done as they are taken. Each ends a finished handler
call with :func:`account` (statistics, the timeline and the count barriers wait for). A
runner reads the clock once an item: an item's time runs from the end of the one before
(or the runner's wake-up) to its own end. They differ in how a call is made: called
here, or awaited.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING

import anyio

from trainbus.bus.lanes import STOP, WAKE_END, CallItem, EventItem, LogItem, would_deadlock
from trainbus.bus.threads import run_in_thread
from trainbus.core.scalars import all_ready

if TYPE_CHECKING:
    from trainbus.bus.bridge import LoopHandle, Spawner
    from trainbus.bus.lanes import Counters, Lane, WorkItem
    from trainbus.bus.members import Slot
    from trainbus.bus.pool import LaneThread
    from trainbus.core.logger import LogRecord

__all__ = ["CURRENT_RUNNER", "account", "fail_lane_thread", "run_lane_thread", "run_loop_lane"]

_RESOLVE_ROLE = "It waits for a record's device values off the event loop"
_CALL_ROLE = "It runs a plain close call of a callback whose lane is on the event loop"

_perf = time.perf_counter

#: Who runs in this thread or task: its lane thread, or the loop lane whose task it is
#: (records logged there wait for room by that runner: ``records.py``).
CURRENT_RUNNER: ContextVar[LaneThread | Lane | None] = ContextVar("trainbus_runner", default=None)

#: Seconds between looks at stopping and cycles while a loop lane waits for room (D12).
ROOM_RECHECK = 0.05


def account(lane: Lane, slot: Slot, batch: int, start: float, elapsed: float,
            counters: Counters, queued: bool = True) -> None:
    """Record one finished handler call of a lane's runner: its slot's statistics, the
    timeline and, for an item of the lane's queue (``queued``; not a record), its progress
    (for the lag statistics) and its count (``lane.counts``), which the gate waits for. The
    one place queued calls are counted, but for a written-out copy in a lane thread's loop
    over a bare event item's handlers (``run_lane_thread``, the hottest loop with many plain
    callbacks), which counts the item once for all of them. (The training thread's own
    ``@blocking`` calls, ``Producer._run_here``, write out the statistics; they are nobody's
    queued item.)"""
    slot.calls += 1
    slot.total_time += elapsed
    if elapsed > slot.max_time:
        slot.max_time = elapsed
    trace = counters.trace
    if trace is not None:
        trace.handler(lane.name, slot.event, start, elapsed)
    if queued:  # Counts.count_done written out: this runs once a handler call
        counts = lane.counts
        counts.last_batch = batch  # how far the queue has got (lag statistics)
        done = counts.done
        depth = counts.enq - done  # the queue at its deepest since the last count
        if depth > counts.peak:
            counts.peak = depth
        counts.done = done = done + 1
        target = counts.wait_done  # read once: the gate may clear it meanwhile
        if target is not None and done >= target:
            lane.gate.reached(counts, lane)


# -- a lane thread -------------------------------------------------------------------------


def _skipped(lane: Lane) -> bool:
    """An event item of a stopping session is counted, not run (D10); true then."""
    if lane.gate.stopping:
        lane.counts.count_done(lane)
        return True
    return False


def run_lane_thread(
    runner: LaneThread, spawner: Spawner, loop: LoopHandle, counters: Counters
) -> None:
    """The body of a lane thread: run its callbacks' items, in its FIFO's order, until
    ``STOP`` (see ``pool.py`` for what the FIFO holds)."""
    CURRENT_RUNNER.set(runner)
    pending, subs, counts = runner.pending, runner.subs, runner.counts
    gate = counts.gate
    t0 = _perf()  # when the current item started: one clock read an item
    while True:
        if not pending:
            runner.sleep()
            t0 = _perf()
            continue
        entry = pending.popleft()
        if type(entry) is EventItem:  # the event of every callback here that only queues it
            view, logger, batch = entry.view, entry.logger, entry.batch
            trace = counters.trace
            # The hottest loop of a fit with many plain callbacks: ``account`` written out,
            # the sub's flags read once (see ``pool.Sub``), the item counted once below for
            # all its handlers. A stopping session runs none of them (D10).
            for lane, slot, fn, is_async, locking in subs[entry.event]:
                if gate.stopping:
                    continue
                if locking:
                    lane.lock.acquire()
                lane.current = slot.qualname
                try:
                    if is_async:
                        spawner.run(fn, view, logger, on_scope=_scope_of(lane))
                    else:
                        fn(view, logger)
                except BaseException as exc:
                    gate.fail(exc, slot.handler, slot.event, lane)
                finally:
                    if locking:
                        lane.lock.release()
                t1 = _perf()
                lane.current = None
                elapsed = t1 - t0
                slot.calls += 1
                slot.total_time += elapsed
                if elapsed > slot.max_time:
                    slot.max_time = elapsed
                if trace is not None:
                    trace.handler(lane.name, slot.event, t0, elapsed)
                t0 = t1
            counts.last_batch = batch
            done = counts.done
            depth = counts.enq - done
            if depth > counts.peak:
                counts.peak = depth
            counts.done = done = done + 1
            target = counts.wait_done
            if target is not None and done >= target:
                gate.reached(counts, lane)  # the last handler's lane ended the wait
            continue
        if entry is STOP:
            return
        lane, item = entry
        locking = lane.member.shares_thread
        if locking:
            lane.lock.acquire()
        try:
            t0 = _run_item(lane, item, t0, spawner, loop, counters)
        finally:
            if locking:
                lane.lock.release()


def _scope_of(lane: Lane) -> Callable[[anyio.CancelScope | None], None]:
    def on_scope(scope: anyio.CancelScope | None) -> None:
        lane.scope = scope

    return on_scope


def _run_item(lane: Lane, item: WorkItem, t0: float, spawner: Spawner, loop: LoopHandle,
              counters: Counters) -> float:
    """Run one callback's item on its lane thread; return when the next item starts."""
    if type(item) is EventItem:
        if _skipped(lane):
            return t0
        slot = lane.slots[item.event]
        lane.current = slot.qualname
        try:
            if slot.is_async:
                spawner.run(slot.fn, item.view, item.logger, on_scope=_scope_of(lane))
            else:
                slot.fn(item.view, item.logger)
        except BaseException as exc:
            lane.gate.fail(exc, slot.handler, slot.event, lane)
        t1 = _perf()
        lane.current = None
        account(lane, slot, item.batch, t0, t1 - t0, counters)
        return t1
    if isinstance(item, LogItem):
        record = item.record
        if record is not None:
            t0 = _deliver_here(lane, record, t0, spawner, counters)
            lane.count_log_done()
            return t0
        box = lane.mailbox  # a marker: the lossy destination's records (module docstring)
        assert box is not None, "a marker is queued only for a mailbox"
        for _ in range(box.limit + 1):  # a full mailbox, then its end
            record, skipped = box.take()
            if skipped:
                lane.count_log_done(skipped)
            if record is None:
                return t0
            t0 = _deliver_here(lane, record, t0, spawner, counters)
            lane.count_log_done()
        runner = lane.thread
        assert runner is not None
        runner.put(lane, item)  # more came meanwhile: the lane's later items go first
        return t0
    assert isinstance(item, CallItem)
    lane.current = item.label or None
    error: BaseException | None = None
    try:
        if item.fn is None:
            pass
        elif item.is_async:
            spawner.run(item.fn, on_scope=_scope_of(lane))
        else:
            item.fn()
    except BaseException as exc:
        error = exc
    lane.current = None
    loop.call_soon_if_running(item.on_done, error)
    return _perf()


def _deliver_here(lane: Lane, record: LogRecord, t0: float, spawner: Spawner,
                  counters: Counters) -> float:
    """Deliver one record to ``lane``'s destination on its lane thread (not counted here);
    return when the next item starts."""
    log_slot = lane.log_slot
    assert log_slot is not None, "only destinations receive records"
    if lane.failed:  # a failed destination gets no more records (D10)
        return t0
    lane.current = log_slot.qualname
    try:
        record = record.resolve()  # may wait for a device copy (D14)
        if log_slot.is_async:
            spawner.run(log_slot.fn, record)
        else:
            log_slot.fn(record)
    except BaseException as exc:
        lane.gate.fail(exc, log_slot.handler, None, lane)
    t1 = _perf()
    account(lane, log_slot, lane.counts.last_batch, t0, t1 - t0, counters, False)
    lane.current = None
    return t1


def _drop_mailbox(lane: Lane) -> None:
    """Count a mailbox's records done without delivering them (a failed lane thread)."""
    box = lane.mailbox
    while box is not None:
        record, skipped = box.take()
        lane.count_log_done(skipped + (record is not None))
        if record is None:
            return


def fail_lane_thread(runner: LaneThread, loop: LoopHandle, error: BaseException) -> None:
    """After an error of the bus itself on a lane thread: count its items without running
    them until ``STOP``, so that nobody waits for it for ever."""
    pending = runner.pending
    while True:
        if not pending:
            runner.sleep()
            continue
        entry = pending.popleft()
        if entry is STOP:
            return
        if type(entry) is EventItem:
            runner.counts.count_done(runner.subs[entry.event][-1][0])
            continue
        lane, item = entry
        if isinstance(item, EventItem):
            lane.counts.count_done(lane)
        elif isinstance(item, LogItem):
            if item.record is None:
                _drop_mailbox(lane)
            else:
                lane.count_log_done()
        elif isinstance(item, CallItem):
            loop.call_soon_if_running(item.on_done, error)


# -- a loop lane ---------------------------------------------------------------------------


async def run_loop_lane(
    lane: Lane, counters: Counters, loop: LoopHandle, finished: anyio.Event
) -> None:
    """``lane``'s task on the loop: run its items until ``STOP``, then set ``finished``.

    The task runs under a cancel scope of its own, ``lane.scope``: cancelling it cancels
    the handler running now (D11, an abandoned close); the task then goes on with a fresh
    scope (a stopping session skips the remaining event items; close calls still run).
    """
    CURRENT_RUNNER.set(lane)
    try:
        while True:
            with anyio.CancelScope() as scope:
                lane.scope = scope
                if await _drain_loop_lane(lane, counters, loop):
                    return
    finally:
        finished.set()


async def _drain_loop_lane(
    lane: Lane, counters: Counters, loop: LoopHandle
) -> bool:
    """Run ``lane``'s items, sleeping when there are none; true at ``STOP``.

    At each ``WAKE_END`` (the end of what one wake-up of the loop brought) the task gives
    the loop a turn: it sleeps if nothing more is queued, else it yields once. So it
    suspends once per wake-up, whether the next one came while it was busy or not."""
    pending, gate, new_event, yield_now = lane.pending, lane.gate, loop.new_event, loop.yield_now
    t0 = _perf()  # when the lane's current item started: one clock read an item
    while True:
        if not pending:
            lane.wakeup = new_event()
            lane.idle = True  # before the second look: see LoopWaker
            if not pending:
                await lane.wakeup.wait()
            lane.idle = False
            t0 = _perf()
            continue
        item = pending.popleft()
        if item is WAKE_END:
            if pending:
                await yield_now()
                t0 = _perf()
            continue
        if item is STOP:
            return True
        if type(item) is EventItem:
            if _skipped(lane):
                continue
            slot = lane.slots[item.event]
            lane.current = slot.qualname
            try:
                await slot.fn(item.view, item.logger)
            except anyio.get_cancelled_exc_class():
                lane.current = None
                account(lane, slot, item.batch, t0, _perf() - t0, counters)
                raise
            except BaseException as exc:
                gate.fail(exc, slot.handler, slot.event, lane)
            lane.current = None
            t1 = _perf()
            account(lane, slot, item.batch, t0, t1 - t0, counters)
            t0 = t1
        elif isinstance(item, LogItem):
            record = item.record
            if record is not None:
                with anyio.CancelScope(shield=True):  # a record in flight is delivered in full
                    await _deliver(lane, record, counters)
                lane.count_log_done()
            else:  # a marker: the lossy destination's records (module docstring)
                box = lane.mailbox
                assert box is not None, "a marker is queued only for a mailbox"
                for _ in range(box.limit + 1):  # a full mailbox, then its end
                    record, skipped = box.take()
                    if skipped:
                        lane.count_log_done(skipped)
                    if record is None:
                        break
                    with anyio.CancelScope(shield=True):
                        await _deliver(lane, record, counters)
                    lane.count_log_done()
                else:  # more came meanwhile: the lane's later items go first
                    pending.append(item)
            t0 = _perf()
        else:
            assert isinstance(item, CallItem)
            await _call(lane, item)
            t0 = _perf()
        if lane.owes is not None:
            await _wait_for_room(lane, loop)


async def _deliver(lane: Lane, record: LogRecord, counters: Counters) -> None:
    slot = lane.log_slot
    assert slot is not None, "only destinations receive records"
    if lane.failed:  # a failed destination gets no more records (D10)
        return
    lane.current = slot.qualname
    t0 = _perf()
    try:
        if not all_ready(record.metrics):  # D14: wait for the device off the loop
            await run_in_thread(record.resolve, needed=_RESOLVE_ROLE)
        result = slot.fn(record.resolve())
        if slot.is_async:
            await result
    except BaseException as exc:
        lane.gate.fail(exc, slot.handler, None, lane)
    account(lane, slot, lane.counts.last_batch, t0, _perf() - t0, counters, False)
    lane.current = None


async def _call(lane: Lane, item: CallItem) -> None:
    lane.current = item.label or None
    error: BaseException | None = None
    try:
        if item.fn is None:
            pass
        elif item.is_async:
            await item.fn()
        else:  # a plain call never runs on the loop's thread (D7)
            await run_in_thread(item.fn, needed=_CALL_ROLE)
    except anyio.get_cancelled_exc_class():
        lane.current = None
        item.on_done(None)
        raise
    except BaseException as exc:
        error = exc
    lane.current = None
    item.on_done(error)


async def _wait_for_room(lane: Lane, loop: LoopHandle) -> None:
    """Pause ``lane`` until the destination its handler logged past the bound has room
    (D12), or the session stops, or waiting could never end. The destination wakes the
    pause as it takes records (``room_wakers``); a look every ``ROOM_RECHECK`` seconds
    notices the rest (stopping, a cycle of lanes waiting for each other)."""
    dest, lane.owes = lane.owes, None
    if dest is None:
        return
    gate = lane.gate
    lane.waiting_on = dest
    try:
        bound = dest.log_limit
        while (
            dest.log_enq - dest.log_done >= bound
            and not (gate.stopping or dest.failed or dest.abandoned)
            and not would_deadlock(lane, dest)
        ):
            room = anyio.Event()
            waker = functools.partial(loop.call_soon_if_running, room.set)
            dest.room_wakers.append(waker)
            try:
                with anyio.move_on_after(ROOM_RECHECK):
                    await room.wait()
            finally:
                dest.room_wakers.remove(waker)
    finally:
        lane.waiting_on = None
