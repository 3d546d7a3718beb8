"""Workers: who runs a callback's handlers, in its queue's order.

A worker is one ``WorkQueue`` run on a lane thread (plain callbacks, several per thread, or
one with ``own_thread = True``) or as a task on the loop (one ``async def``-only callback),
fixed for the run (:func:`place`, D7). It runs its items (``queue.py``) in order; on a thread
an ``async def`` handler runs on the loop (``bridge.Spawner``) and is waited for (D1). A
stopping session's event items are counted, not run (D10). An item's time runs from the end
of the one before (or the wake-up) to its own end: one clock read an item.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from time import perf_counter as _perf
from typing import TYPE_CHECKING

import anyio

from trainbus.bus.mailbox import Mailbox
from trainbus.bus.queue import STOP, WAKE_END, CallItem, EventItem, LogItem, RecordCounts, WorkQueue
from trainbus.core.scalars import all_ready
from trainbus.core.threads import run_in_thread

if TYPE_CHECKING:
    from trainbus.bus.counters import Counters
    from trainbus.bus.members import Member, Slot
    from trainbus.bus.queue import Gate, WorkItem
    from trainbus.core.bridge import LoopEvent, LoopHandle, Spawner
    from trainbus.core.events import Event
    from trainbus.core.logger import LogRecord
    from trainbus.observe.trace import TraceRecorder

__all__ = [
    "CURRENT_WORKER", "Lane", "Worker", "hand_over_on_loop", "place", "wake_on_loop",
    "would_deadlock",
]

_RESOLVE_ROLE = "It waits for a record's device values off the event loop"
_CALL_ROLE = "It runs a plain close call of a callback whose lane is on the event loop"

#: The worker running in this thread or task (records logged there wait for room by it).
CURRENT_WORKER: ContextVar[Worker | None] = ContextVar("trainbus_worker", default=None)

#: Seconds between looks at stopping and cycles while a loop worker waits for room (D12).
ROOM_RECHECK = 0.05


class Lane:
    """One callback for one session: its handlers, its worker, its records, its state.

    Attributes:
        records: Its records' counts (a destination's, D12); ``mailbox``: a lossy one's.
        lock: Held by whoever runs one of its items when the training thread runs some of
            its plain handlers too (``shares``): never both at once (D1).
        current: The handler running now (``"Class.method"``), else ``None``. Invariant:
            written only by the thread running its handler.
        scope: The cancel scope of its coroutine handler running now, if any (D11).
        owes: On the loop: a destination its handler logged past the bound (waited for).
        failed: One of its handlers raised: it runs nothing more but its close (D10).
        abandoned: It missed its close deadline: nobody waits for it any more.
    """

    __slots__ = ("abandoned", "current", "failed", "index", "lock", "log_slot", "mailbox",
                 "member", "name", "on_thread", "owes", "records", "scope", "shares", "slots",
                 "worker")

    def __init__(self, member: Member, gate: Gate, queue_size: int = 128) -> None:
        self.member = member
        self.name = member.name
        self.index = member.index
        self.slots = member.slots
        self.log_slot = member.log_slot
        self.on_thread = member.on_thread
        self.shares = member.shares_thread
        self.worker: Worker = None  # type: ignore[assignment]  # place() sets it
        self.lock = threading.Lock()
        policy = member.backpressure
        own = None if policy is None else policy.queue_size
        self.records = RecordCounts(gate.reached, queue_size if own is None else own, member)
        self.mailbox = (
            Mailbox(self.records, member, policy) if policy is not None and policy.lossy else None
        )
        self.owes: Lane | None = None
        self.scope: anyio.CancelScope | None = None
        self.abandoned = False
        self.current: str | None = None
        self.failed = False

    def fail(self, exc: BaseException, slot: Slot) -> None:
        """One of its handlers raised: mark it failed and stop the run (D10)."""
        self.failed = True
        self.worker.gate.fail(exc, slot.handler, slot.event)


def finished(lane: Lane, slot: Slot, start: float, elapsed: float,
             trace: TraceRecorder | None) -> None:
    """A handler call finished, wherever it ran: its slot's statistics and the timeline."""
    slot.calls += 1
    slot.total_time += elapsed
    if elapsed > slot.max_time:
        slot.max_time = elapsed
    if trace is not None:
        trace.handler(lane.name, slot.event, start, elapsed)


def would_deadlock(waiter: Worker | None, dest: Lane) -> bool:
    """Whether ``waiter`` waiting for room in ``dest`` could wait for ever: ``dest`` runs on
    ``waiter``, or on a worker waiting (through a chain of such waits) for ``waiter``."""
    worker: Worker | None = dest.worker
    for _ in range(64):
        if worker is None:
            return False
        if worker is waiter:
            return True
        nxt = worker.waiting_on
        worker = nxt.worker if nxt is not None else None
    return True


class Worker:
    """Runs one queue's items, on a lane thread or as a task on the loop (module doc).

    Attributes:
        lanes: Its callbacks' lanes, in list order (one for a worker on the loop).
        subs: Per event, the ``(lane, slot)`` it runs for an item that names no lane, in
            list order (set by ``Producer``).
        idle: Whether it sleeps (or is about to). Invariant: set by the worker before its
            second look at the queue, so an append either is seen or sees it sleep.
        waiting_on: The destination whose room one of its handlers waits for (records).
        name: ``trainbus-lane-<Callback>`` (``+<n>`` when it serves n more).
    """

    __slots__ = ("chain", "counters", "gate", "idle", "lanes", "loop", "name", "on_thread",
                 "passed", "place", "queue", "sleeper", "spawner", "subs", "thread",
                 "waiting_on", "wakes", "wakeup")

    def __init__(self, lanes: Sequence[Lane], on_thread: bool, gate: Gate, counters: Counters,
                 loop: LoopHandle, spawner: Spawner, queue_size: int = 128) -> None:
        self.lanes = list(lanes)
        self.on_thread = on_thread
        more = len(self.lanes) - 1
        self.name = f"trainbus-lane-{self.lanes[0].name}" + (f"+{more}" if more else "")
        lags = frozenset().union(*(lane.member.lags for lane in self.lanes))
        self.gate = gate
        self.queue = WorkQueue(gate.reached, queue_size, lags)
        if not on_thread:
            self.queue.inbox = []  # the publishing thread's until a hand-over
        self.subs: dict[Event, list[tuple[Lane, Slot]]] = {}
        self.counters = counters
        self.loop = loop
        self.spawner = spawner
        self.idle = False
        self.waiting_on: Lane | None = None
        self.thread: threading.Thread | None = None
        self.sleeper = threading.Lock()
        self.sleeper.acquire()
        self.wakeup: LoopEvent | None = None  # on the loop: what its task sleeps on
        self.chain: list[Worker] = []  # the session's thread workers, in pool order
        self.place = 0  # its index in ``chain``
        self.passed = 0  # the last of the producer's wake-ups it passed on (``wake_chain``)
        self.wakes = [0]  # the wake-ups the producer started down the chain (shared by it)
        for lane in self.lanes:
            lane.worker = self

    def put(self, item: WorkItem) -> None:
        """Queue a non-event item; wake the worker if it sleeps (a thread: from any thread;
        a task: from the loop's thread, elsewhere the caller wakes it, ``records.py``)."""
        self.queue.items.append(item)
        if self.idle:  # after the append: see ``idle``
            if self.on_thread:
                self.wake()
            elif self.wakeup is not None and threading.get_ident() == self.loop.thread_id:
                self.wakeup.set()

    @property
    def pending(self) -> deque[WorkItem]:
        """The items waiting in its queue (on the loop: those handed over)."""
        return self.queue.items

    # -- a thread's sleep and wake-up -------------------------------------------------------

    def sleep(self) -> None:
        """This thread: sleep until :meth:`wake`, unless something was queued; then, before
        running anything, pass the producer's latest wake-up on down the chain."""
        self.idle = True  # before the second look: an append either is seen or sees idle
        if not self.queue.items:
            self.sleeper.acquire()
        self.idle = False
        started = self.wakes[0]
        if started != self.passed:
            self.passed = started
            wake_chain(self.chain, self.place + 1)

    def wake(self) -> None:
        """Wake the thread, which sleeps or is about to (any thread; ``locked()`` spares a
        second release of a thread woken and not yet running)."""
        sleeper = self.sleeper
        if sleeper.locked():
            try:
                sleeper.release()
            except RuntimeError:  # released meanwhile by another thread
                pass

    # -- on a lane thread -----------------------------------------------------------------

    def run_thread(self) -> None:
        """The body of a lane thread: run the queue's items until ``STOP``."""
        CURRENT_WORKER.set(self)
        queue, items, subs, spawner = self.queue, self.queue.items, self.subs, self.spawner
        gate, counters = self.gate, self.counters
        t0 = _perf()
        while True:
            if not items:
                self.sleep()
                t0 = _perf()
                continue
            item = items.popleft()
            if type(item) is EventItem:
                lane = item.lane
                handlers = subs[item.event] if lane is None else ((lane, lane.slots[item.event]),)
                view, logger, trace = item.view, item.logger, counters.trace
                # Hot: ``finished`` and ``WorkQueue.count_done`` written out (a call costs
                # about as much as the rest of the loop).
                for lane, slot in handlers:
                    if gate.stopping:  # D10: counted, not run
                        continue
                    locking = lane.shares
                    if locking:
                        lane.lock.acquire()
                    lane.current = slot.qualname
                    try:
                        if slot.is_async:
                            spawner.run(slot.fn, view, logger, on_scope=_scope_of(lane))
                        else:
                            slot.fn(view, logger)
                    except BaseException as exc:
                        lane.fail(exc, slot)
                    finally:
                        if locking:
                            lane.lock.release()
                    lane.current = None
                    t1 = _perf()
                    elapsed = t1 - t0
                    slot.calls += 1
                    slot.total_time += elapsed
                    if elapsed > slot.max_time:
                        slot.max_time = elapsed
                    if trace is not None:
                        trace.handler(lane.name, slot.event, t0, elapsed)
                    t0 = t1
                queue.last_batch = item.batch
                done = queue.done
                if queue.enq - done > queue.peak:
                    queue.peak = queue.enq - done
                queue.done = done = done + 1
                target = queue.wait_done  # read once: the gate may clear it meanwhile
                if target is not None and done >= target:
                    gate.reached(queue, lane.member)
            elif type(item) is LogItem:
                lane = item.lane
                for record in _records_of(item):
                    t0 = self._deliver_here(lane, record, t0)
                    lane.records.count_done()
            elif type(item) is CallItem:
                lane = item.lane
                locking = lane.shares
                if locking:
                    lane.lock.acquire()
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
                finally:
                    if locking:
                        lane.lock.release()
                lane.current = None
                self.loop.call_soon_if_running(item.on_done, error)
                t0 = _perf()
            elif item is STOP:
                return

    def _deliver_here(self, lane: Lane, record: LogRecord, t0: float) -> float:
        """Deliver ``record`` to ``lane``'s destination here; return when the next item starts."""
        slot = lane.log_slot
        assert slot is not None, "only destinations receive records"
        if lane.failed:  # a failed destination gets no more records (D10)
            return t0
        locking = lane.shares
        if locking:
            lane.lock.acquire()
        lane.current = slot.qualname
        try:
            record = record.resolve()  # may wait for a device copy (D14)
            if slot.is_async:
                self.spawner.run(slot.fn, record)
            else:
                slot.fn(record)
        except BaseException as exc:
            lane.fail(exc, slot)
        finally:
            if locking:
                lane.lock.release()
        lane.current = None
        t1 = _perf()
        finished(lane, slot, t0, t1 - t0, self.counters.trace)
        return t1

    def drain_failed(self, error: BaseException) -> None:
        """After an error of the bus itself on this thread: count its items, not run, until
        ``STOP``, so that nobody waits for it for ever."""
        items = self.queue.items
        while True:
            if not items:
                self.sleep()
                continue
            item = items.popleft()
            if item is STOP:
                return
            if type(item) is EventItem:
                self.queue.count_done(item.batch, None)
            elif type(item) is LogItem:
                for _ in _records_of(item):
                    item.lane.records.count_done()
            elif type(item) is CallItem:
                self.loop.call_soon_if_running(item.on_done, error)

    # -- on the loop ----------------------------------------------------------------------

    async def run_task(self, finished_event: anyio.Event) -> None:
        """Run its items on the loop until ``STOP``, then set ``finished_event``. Cancelling
        ``lane.scope`` cancels the handler running now (D11); a fresh scope goes on."""
        CURRENT_WORKER.set(self)
        lane = self.lanes[0]
        try:
            while True:
                with anyio.CancelScope() as scope:
                    lane.scope = scope
                    if await self._run_on_loop(lane):
                        return
        finally:
            finished_event.set()

    async def _run_on_loop(self, lane: Lane) -> bool:
        """Run the items, sleeping when there are none; true at ``STOP``. At ``WAKE_END`` (a
        hand-over's end) it gives the loop a turn: it sleeps if nothing is queued, else yields."""
        queue, items, gate, counters = self.queue, self.queue.items, self.gate, self.counters
        new_event, yield_now = _event_factory(self.loop), self.loop.yield_now
        t0 = _perf()
        while True:
            if not items:
                self.wakeup = new_event()
                self.idle = True  # before the second look: see ``idle``
                if not items:
                    await self.wakeup.wait()
                self.idle = False
                t0 = _perf()
                continue
            item = items.popleft()
            if item is WAKE_END:
                if items:
                    await yield_now()
                    t0 = _perf()
                continue
            if item is STOP:
                return True
            if type(item) is EventItem:
                if not gate.stopping:  # D10: counted, not run
                    slot = lane.slots[item.event]
                    lane.current = slot.qualname
                    try:
                        await slot.fn(item.view, item.logger)
                    except anyio.get_cancelled_exc_class():
                        lane.current = None
                        finished(lane, slot, t0, _perf() - t0, counters.trace)
                        queue.count_done(item.batch, lane.member)
                        raise
                    except BaseException as exc:
                        lane.fail(exc, slot)
                    lane.current = None
                    # Hot: ``finished`` and ``WorkQueue.count_done`` written out, as in
                    # ``run_thread`` (two calls cost about 6% of an ``async def`` call).
                    t1 = _perf()
                    elapsed = t1 - t0
                    slot.calls += 1
                    slot.total_time += elapsed
                    if elapsed > slot.max_time:
                        slot.max_time = elapsed
                    if counters.trace is not None:
                        counters.trace.handler(lane.name, slot.event, t0, elapsed)
                    t0 = t1
                queue.last_batch = item.batch
                done = queue.done
                if queue.enq - done > queue.peak:
                    queue.peak = queue.enq - done
                queue.done = done = done + 1
                target = queue.wait_done  # read once: the gate may clear it meanwhile
                if target is not None and done >= target:
                    gate.reached(queue, lane.member)
            elif type(item) is LogItem:
                for record in _records_of(item):
                    with anyio.CancelScope(shield=True):  # a record in flight goes in full
                        await self._deliver(lane, record)
                    lane.records.count_done()
                t0 = _perf()
            else:
                assert type(item) is CallItem
                await _call(lane, item)
                t0 = _perf()
            if lane.owes is not None:
                await self._wait_for_room(lane)

    async def _deliver(self, lane: Lane, record: LogRecord) -> None:
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
            lane.fail(exc, slot)
        finished(lane, slot, t0, _perf() - t0, self.counters.trace)
        lane.current = None

    async def _wait_for_room(self, lane: Lane) -> None:
        """Pause until the destination ``lane``'s handler logged past the bound has room (D12),
        or the session stops, or waiting could never end (a look every ``ROOM_RECHECK`` seconds)."""
        dest, lane.owes = lane.owes, None
        if dest is None:
            return
        gate, records = self.gate, dest.records
        self.waiting_on = dest
        try:
            while (
                records.enq - records.done >= records.bound
                and not (gate.stopping or dest.failed or dest.abandoned)
                and not would_deadlock(self, dest)
            ):
                room = anyio.Event()
                waker = functools.partial(self.loop.call_soon_if_running, room.set)
                records.room_wakers.append(waker)
                try:
                    with anyio.move_on_after(ROOM_RECHECK):
                        await room.wait()
                finally:
                    records.room_wakers.remove(waker)
        finally:
            self.waiting_on = None


def _records_of(item: LogItem) -> Iterable[LogRecord]:
    """The records a log item brings: its record, or those its marker takes (``Mailbox.takes``)."""
    if item.record is not None:
        return (item.record,)
    lane: Lane = item.lane
    assert lane.mailbox is not None, "a marker is queued only for a mailbox"
    return lane.mailbox.takes(functools.partial(lane.worker.queue.items.append, item))


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


class _FutureEvent:
    """A worker's sleep on asyncio: one future, set once (loop thread), what ``anyio.Event``
    awaits under two Python layers and a coroutine; the task's cancel scope cancels it."""

    __slots__ = ("_future",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._future = loop.create_future()

    def set(self) -> None:
        if not self._future.done():
            self._future.set_result(None)

    def wait(self) -> asyncio.Future[None]:
        return self._future


def _event_factory(loop: LoopHandle) -> Callable[[], LoopEvent]:
    """What a worker on ``loop`` sleeps on: a :class:`_FutureEvent`, or on trio a ``trio.Event``."""
    if loop.asyncio_loop is not None:
        return functools.partial(_FutureEvent, loop.asyncio_loop)
    return sys.modules["trio"].Event  # type: ignore[no-any-return]


def _scope_of(lane: Lane) -> Callable[[anyio.CancelScope | None], None]:
    def on_scope(scope: anyio.CancelScope | None) -> None:
        lane.scope = scope

    return on_scope


# -- placement and waking ------------------------------------------------------------------


def place(lanes: Sequence[Lane], size: int, gate: Gate, counters: Counters,
          loop: LoopHandle, spawner: Spawner, queue_size: int) -> list[Worker]:
    """The workers of a session, a rule of the callback list, never of time (D7): pooled plain
    callbacks round ``size`` threads, ``own_thread`` ones a thread each, the rest a task each."""
    pooled = [lane for lane in lanes if lane.on_thread and not lane.member.own_thread]
    groups: list[list[Lane]] = [[] for _ in range(min(size, len(pooled)))]
    for k, lane in enumerate(pooled):
        groups[k % size].append(lane)
    groups += [[lane] for lane in lanes if lane.on_thread and lane.member.own_thread]
    threads = [Worker(group, True, gate, counters, loop, spawner, queue_size) for group in groups]
    wakes = [0]
    for k, worker in enumerate(threads):
        worker.chain, worker.place, worker.wakes = threads, k, wakes
    tasks = [Worker([lane], False, gate, counters, loop, spawner, queue_size)
             for lane in lanes if not lane.on_thread]
    return threads + tasks


def wake_chain(chain: Sequence[Worker], start: int = 0) -> None:
    """Wake the first of ``chain[start:]`` that sleeps (or is about to) with work queued: the
    producer's one wake-up, passed down the pool (``docs/concurrency.md`` "Lane threads", D2)."""
    for k in range(start, len(chain)):
        worker = chain[k]
        if worker.idle and worker.queue.items:
            worker.wake()
            return


def hand_over_on_loop(waves: Sequence[tuple[Worker, Sequence[WorkItem]]],
                      counters: Counters) -> None:
    """On the loop: give each worker its items handed over (``Producer.hand_over``), then
    ``WAKE_END``, and wake it if it sleeps: one call into the loop for them all."""
    counters.loop_wakeups += 1
    for worker, items in waves:
        queue = worker.queue.items
        queue.extend(items)
        queue.append(WAKE_END)
        # On the loop a worker's task is either asleep (idle) or running: never between.
        if worker.idle and worker.wakeup is not None:
            worker.wakeup.set()


def wake_on_loop(workers: Sequence[Worker], counters: Counters) -> None:
    """On the loop: wake those of ``workers`` that sleep with items queued off the loop."""
    counters.loop_wakeups += 1
    for worker in workers:
        if worker.idle and worker.queue.items and worker.wakeup is not None:
            worker.wakeup.set()
