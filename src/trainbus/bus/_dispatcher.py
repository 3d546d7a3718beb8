"""The loop side of the bus: one dispatcher task runs the loop lanes, eagerly.

Waking a task per handler call costs several microseconds of task switching; most
handlers (metric bookkeeping, a queue append) finish without ever suspending. So the
dispatcher runs each coroutine handler's first step itself, inside its own task. If the
handler returns without suspending, that was the whole call: no task was created or
woken. If it suspends, the dispatcher *becomes* that lane's task: it hands dispatching to
another task and keeps driving the suspended handler with ``await``, so the handler stays
in the task that started it (anyio and trio cancel scopes and ``current_task()`` see one
task throughout), then drains the rest of its lane and parks as a spare. The next hand-over
wakes a spare rather than spawning a task (tens of microseconds in anyio), so a lane whose
handler awaits I/O every batch costs no task per call.

The dispatcher sleeps when no lane is ready; producers wake it at most once per burst,
and only when it is asleep. A lane is handed to the dispatcher (``ready``) only when it
moves to ``ACTIVE`` (``_lane.py``), so two tasks never drain one lane.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import anyio

from trainbus.bus._coroutine import FRESH, DispatcherTask, Resume, Spare, item_label
from trainbus.bus._eligibility import ban, learn
from trainbus.bus._items import CallItem, EventItem, LogItem, WorkItem
from trainbus.bus._lane import IDLE
from trainbus.bus._running import finish_event, skip_event
from trainbus.core.scalars import all_ready

if TYPE_CHECKING:
    from trainbus.bus._bridge import LoopHandle
    from trainbus.bus._gate import Gate
    from trainbus.bus._lane import Lane
    from trainbus.bus._statistics import Counters
    from trainbus.core.logger import LogRecord

__all__ = ["Dispatcher"]

_perf = time.perf_counter


class Dispatcher:
    """Runs the items of loop lanes on the event loop (see the module docstring)."""

    def __init__(self, gate: Gate, counters: Counters, loop: LoopHandle,
                 queue_size: int = 128, inline_max: float = 0.0) -> None:
        self.gate = gate
        self.counters = counters
        self.loop = loop
        #: The inline fast path's limit: cheap coroutine handlers are deferred (``_inline.py``).
        self.inline_max = inline_max
        #: The records' bound per destination (D12), which a lane that ``owes`` waits for.
        self.queue_size = queue_size
        #: The loop lane whose handler runs on the loop right now, if any.
        self.running: Lane | None = None
        # Invariant: a lane is in ``ready`` at most once, and only while ACTIVE and not yet
        # owned by a task: it is appended by whoever moved it to ACTIVE (``Lane.wake``).
        self.ready: deque[Lane] = deque()
        self.asleep = False
        self.wake_scheduled = False
        self.stopping = False
        self._event: anyio.Event | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        # Tasks that owned a lane to its end, parked until the dispatcher's role comes back
        # to them (``_hand_over``): spawning a task costs tens of microseconds in anyio.
        # Invariant: one event per parked task; loop thread only.
        self._spares: list[Spare] = []

    # -- any thread ------------------------------------------------------------------------

    def schedule(self, lane: Lane) -> None:
        """Queue a lane that just became ACTIVE; then :meth:`kick` (any thread)."""
        self.ready.append(lane)

    def wake_lane(self, lane: Lane) -> None:
        """A loop lane's ``wake_driver``: schedule it and wake the dispatcher."""
        self.ready.append(lane)
        self.kick()

    def wake_lanes(self, lanes: list[Lane]) -> None:
        """Wake idle loop lanes with one wake-up of the dispatcher (any thread)."""
        for lane in lanes:
            if lane.state == IDLE and lane.activate():
                self.ready.append(lane)
        self.kick()

    def kick(self) -> None:
        """Wake the dispatcher if it sleeps; call after one or more ``schedule``."""
        if self.asleep and not self.wake_scheduled:
            self.wake_scheduled = True
            self.loop.call_soon(self._on_wake)

    def _on_wake(self) -> None:
        self.wake_scheduled = False
        self.counters.loop_wakeups += 1
        event = self._event
        if event is not None:
            event.set()

    # -- loop ------------------------------------------------------------------------------

    def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Start the first dispatcher task in ``tg``."""
        self._tg = tg
        self.stopping = False
        self.asleep = False
        self.wake_scheduled = False
        self._spares = []
        tg.start_soon(self._run, name="trainbus-dispatcher")

    def stop(self) -> None:
        """Make the dispatcher task end once no lane is ready, and the spares at once (loop
        thread)."""
        self.stopping = True
        event = self._event
        if event is not None:
            event.set()
        spares, self._spares = self._spares, []
        for spare in spares:
            spare.event.set()  # not handed the role: it ends

    async def _run(self) -> None:
        # Each turn as the dispatcher enters a cancel scope of its own before running any
        # handler: handlers' own cancel scopes then nest inside it, also across the hand-over.
        # The bus cancels it (lane.scope) to cancel the handler this task owns. A task that
        # owned a lane to its end parks as a spare, until the role comes back to it.
        while True:
            task = DispatcherTask()
            with task.scope:
                owned = await self._dispatch(task)
            lane = task.lane
            if lane is not None:  # cancelled while owning a lane: hand the rest on
                lane.scope = None
                lane.waiting_on = None
                if task.item is not None:  # None: cancelled while paused between items
                    self._finish(lane, task.item, None, task.t0)
                self.schedule(lane)
                self.kick()
                return
            if not owned or task.scope.cancel_called or not await self._park():
                return

    async def _park(self) -> bool:
        """Wait as a spare; true when handed the dispatcher's role (even if stopping meanwhile:
        the role then drains what is ready), false when ended by :meth:`stop`."""
        if self.stopping:
            return False
        spare = Spare()
        self._spares.append(spare)
        await spare.event.wait()
        return spare.handed

    def _hand_over(self) -> None:
        """Give the dispatcher's role to a spare task, or to a new one."""
        if self._spares:
            spare = self._spares.pop()
            spare.handed = True
            spare.event.set()
        else:
            assert self._tg is not None
            self._tg.start_soon(self._run, name="trainbus-dispatcher")

    async def _dispatch(self, task: DispatcherTask) -> bool:
        """Dispatch until stopping (false) or until a handler suspends: then hand the role
        over, own that handler's lane to its end and return true."""
        ready = self.ready
        while True:
            try:
                lane = ready.popleft()
            except IndexError:
                if self.stopping:
                    return False
                event = self._event = anyio.Event()
                self.asleep = True
                if ready or self.stopping:
                    self.asleep = False
                    continue
                await event.wait()
                self.asleep = False
                continue
            suspended = self._drain_eagerly(lane)
            if suspended is not None:
                self._hand_over()
                await self._own(task, lane, *suspended)
                return True

    def _start(self, lane: Lane, item: WorkItem) -> Coroutine[Any, Any, Any] | None:
        """Begin ``item``: run it if it is synchronous, else return its coroutine.

        Returns ``None`` for a synchronous item, which the caller then finishes; raises
        :class:`_Skipped` for an event item of a stopping session, which ``_finish`` counts.
        """
        if isinstance(item, EventItem):
            slot = lane.slots[item.event]
            if self.gate.stopping:
                raise _Skipped
            result = slot.fn(item.view, item.logger)
            return result if slot.is_async else None
        if isinstance(item, CallItem):
            result = item.fn()
            return result if item.is_async else None
        assert isinstance(item, LogItem), "loop lanes never get STOP"
        if lane.failed:  # a failed destination gets no more records (D10)
            raise _Skipped
        record = item.record
        if not all_ready(record.metrics):
            return self._deliver_when_ready(lane, record)
        record.resolve()
        log_slot = lane.log_slot
        assert log_slot is not None
        result = log_slot.fn(record)
        return result if log_slot.is_async else None

    async def _deliver_when_ready(self, lane: Lane, record: LogRecord) -> None:
        await anyio.to_thread.run_sync(record.resolve)
        slot = lane.log_slot
        assert slot is not None
        result = slot.fn(record)
        if slot.is_async:
            await result

    def _finish(self, lane: Lane, item: WorkItem, error: BaseException | None,
                t0: float) -> None:
        if isinstance(error, _Skipped):
            if isinstance(item, EventItem):
                skip_event(lane)
            elif isinstance(item, LogItem):
                lane.count_log_done()
            return
        elapsed = _perf() - t0
        if isinstance(item, EventItem):
            slot = lane.slots[item.event]
            if error is not None:
                self.gate.fail(error, slot.handler, slot.event, lane)
            finish_event(lane, slot, item, elapsed, self.counters)
        elif isinstance(item, CallItem):
            item.on_done(error)
        elif isinstance(item, LogItem):
            log_slot = lane.log_slot
            assert log_slot is not None
            if error is not None:
                self.gate.fail(error, log_slot.handler, None, lane)
            log_slot.account(elapsed)
            lane.count_log_done()

    def _drain_eagerly(
        self, lane: Lane
    ) -> tuple[WorkItem | None, Coroutine[Any, Any, Any] | None, Any, float] | None:
        """Run ``lane``'s items in this task until it is empty, a handler suspends (its
        item and coroutine are returned) or the lane owes a wait for room (``None``s)."""
        pending = lane.pending
        gate = self.gate
        slots = lane.slots
        counters = self.counters
        inline_max = self.inline_max
        while True:
            if lane.owes is not None:  # pause the lane: the caller owns it, then pays
                return None, None, None, 0.0
            if pending:
                item = pending.popleft()
            else:
                taken = lane.take()
                if taken is None:
                    return None
                item = taken
            t0 = _perf()
            if type(item) is EventItem and not gate.stopping:
                # The hot path, written out: an event handler run to completion here.
                slot = slots[item.event]
                self.running = lane
                try:
                    result = slot.fn(item.view, item.logger)
                    if slot.is_async:
                        yielded = result.send(None)
                        self.running = None
                        if not slot.inline_banned:
                            ban(slot)  # it suspends: the loop is woken for it at once
                        return item, result, yielded, t0
                except StopIteration:
                    pass
                except BaseException as exc:
                    self.running = None
                    self._finish(lane, item, exc, t0)
                    continue
                self.running = None
                elapsed = _perf() - t0
                if not slot.inline_ok or elapsed > inline_max or slot.inline_strike:
                    learn(slot, elapsed, inline_max)
                slot.calls += 1  # Slot.account, finish_event and Lane.count_done, inlined
                slot.total_time += elapsed
                if elapsed > slot.max_time:
                    slot.max_time = elapsed
                lane.last_batch = item.batch
                trace = counters.trace
                if trace is not None:
                    trace.handler(lane.name, slot.event, t0, elapsed)
                lane.done += 1
                target = lane.wait_done
                if target is not None and lane.done >= target:
                    lane.notify(lane)
                continue
            self.running = lane
            try:
                coro = self._start(lane, item)
                if coro is None:
                    self.running = None
                    self._finish(lane, item, None, t0)
                    continue
                yielded = coro.send(None)
            except StopIteration:
                self.running = None
                self._finish(lane, item, None, t0)
            except BaseException as exc:
                self.running = None
                self._finish(lane, item, exc, t0)
            else:
                self.running = None
                return item, coro, yielded, t0

    async def _own(self, task: DispatcherTask, lane: Lane, item: WorkItem | None,
                   coro: Coroutine[Any, Any, Any] | None, yielded: Any, t0: float) -> None:
        """Finish a suspended handler in this task, then drain its lane (no more eagerness).

        With no ``coro``, the lane first pays what it owes (``_records.py``).
        """
        cancelled = anyio.get_cancelled_exc_class()
        task.lane = lane
        awaitable: Any
        if coro is None:  # paused before its next item: pay, then go on
            task.item = None
            await self._pay(lane)
            item, awaitable, t0 = await self._next(task, lane)
        else:
            awaitable = Resume(coro, yielded, lane, self)
        while awaitable is not None:
            assert item is not None
            task.item, task.t0 = item, t0
            # Event handlers and calls (close) can be cancelled (D11, close_timeout); a log
            # record in flight is delivered in full.
            lane.scope = None if isinstance(item, LogItem) else task.scope
            lane.current = item_label(lane, item)
            error: BaseException | None = None
            try:
                await awaitable
            except cancelled:
                raise  # to this task's scope; _run hands the lane on
            except BaseException as exc:
                error = exc
            self._finish(lane, item, error, t0)
            item, awaitable, t0 = await self._next(task, lane)
        task.lane = lane.scope = None
        lane.current = None

    async def _next(
        self, task: DispatcherTask, lane: Lane
    ) -> tuple[WorkItem | None, Any, float]:
        """Run ``lane``'s synchronous items until one returns a coroutine (then return it
        with its item, wrapped to track ``running``) or the lane is empty (``None``s)."""
        while True:
            if lane.owes is not None:
                task.item = None
                await self._pay(lane)
            item = lane.take()
            if item is None:
                return None, None, 0.0
            t0 = _perf()
            self.running = lane
            try:
                coro = self._start(lane, item)
            except BaseException as exc:
                self.running = None
                self._finish(lane, item, exc, t0)
                continue
            self.running = None
            if coro is None:
                self._finish(lane, item, None, t0)
                continue
            return item, Resume(coro, FRESH, lane, self), t0

    async def _pay(self, lane: Lane) -> None:
        """Pause ``lane`` until the destination it owes has room for records (D12)."""
        dest = lane.owes
        lane.owes = None
        if dest is not None:
            gate = self.gate
            await lane.pay(dest, self.queue_size, lambda: gate.stopping,
                           self.loop.call_soon_if_running)


class _Skipped(Exception):
    """Raised by ``_start`` for an item that is not run (D10): an event item once the
    session stops, a record for a destination that failed."""
