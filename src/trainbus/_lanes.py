"""Lanes: one per callback, running its handlers one at a time, in publication order.

A lane is a FIFO of work items and a driver that empties it. Callbacks whose handlers
are all coroutines get a *loop lane*, run by the dispatcher (``_dispatch.py``). Callbacks
with any plain
(non-``@blocking``) handler get a *thread lane*: a long-lived thread of their own, so a
handler that blocks never blocks the loop (D7) or other callbacks (D2). A thread lane
runs the callback's coroutine handlers, if it has any, on the loop and waits for them.

Drivers sleep when their queue is empty and are woken once per burst, not once per
item: the producer wakes a lane only when it sees the lane's ``idle`` flag set. The
lane sets the flag, then re-checks its queue before sleeping, so no wake-up is lost; a
spare wake-up costs one empty pass.

Counting: ``enq`` (written by the producer) and ``done`` (written by the driver) count
event items only. The producer waits for ``done`` to reach a target (barriers,
backpressure, ``@blocking``); the driver reports when it gets there.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any

import anyio

from trainbus._callback import Handler, HandlerTable
from trainbus._events import Event

if TYPE_CHECKING:
    from trainbus._bus import EventBus
    from trainbus._logger import LogRecord

__all__ = [
    "CALL",
    "EVENT",
    "LOG",
    "STOP",
    "Lane",
    "Slot",
    "count_done",
    "count_log_done",
    "drain_broken",
    "finish_event",
    "thread_driver",
]

# Work item kinds; items are tuples whose first element is the kind.
EVENT = 0  # (EVENT, slot, state_view, logger)
LOG = 1  # (LOG, record, counted): counted in log_enq when the producer logged it (D12)
CALL = 2  # (CALL, fn, is_async, on_done)     fn() or await fn(); then on_done(exc | None)
STOP = 3  # (STOP,)

_perf = time.perf_counter


class Slot:
    """One handler of one lane, with its statistics and inline eligibility."""

    __slots__ = (
        "calls",
        "event",
        "fn",
        "handler",
        "inline_banned",
        "inline_calls",
        "inline_ok",
        "is_async",
        "is_blocking",
        "max_time",
        "total_time",
        "when",
    )

    def __init__(self, handler: Handler, event: Event | None) -> None:
        self.handler = handler
        self.event = event
        self.fn = handler.fn
        self.is_async = handler.is_async
        self.is_blocking = handler.is_blocking
        self.when = handler.when
        self.calls = 0
        self.inline_calls = 0
        self.total_time = 0.0
        self.max_time = 0.0
        self.inline_ok = False
        self.inline_banned = False

    def account(self, elapsed: float) -> None:
        self.calls += 1
        self.total_time += elapsed
        if elapsed > self.max_time:
            self.max_time = elapsed


class Lane:
    """The queue and driver state of one callback."""

    __slots__ = (
        "busy",
        "busy_mark",
        "deferred",
        "done",
        "enq",
        "exec_lock",
        "idle",
        "index",
        "is_destination",
        "last_batch",
        "log_done",
        "log_enq",
        "log_slot",
        "log_wait_target",
        "name",
        "on_thread",
        "peak",
        "pending",
        "scope",
        "slots",
        "slow_batches",
        "stopped",
        "table",
        "thread",
        "tokens",
        "wait_target",
    )

    def __init__(self, table: HandlerTable, index: int, log_handler: Handler | None) -> None:
        self.table = table
        self.name = table.name
        self.index = index
        self.slots = {event: Slot(h, event) for event, h in table.handlers.items()}
        self.log_slot = Slot(log_handler, None) if log_handler is not None else None
        self.is_destination = log_handler is not None
        plain_log = log_handler is not None and not log_handler.is_async
        self.on_thread = table.has_sync or plain_log
        self.pending: deque[tuple[Any, ...]] = deque()
        self.exec_lock = threading.Lock()
        self.tokens: SimpleQueue[None] = SimpleQueue()
        self.reset()

    def reset(self) -> None:
        """Clear per-session counters (statistics are kept)."""
        self.pending.clear()
        self.enq = 0
        self.done = 0
        self.idle = True
        self.deferred = False  # holds items queued without a wake-up (run at the next barrier)
        self.stopped = False
        self.wait_target: int | None = None
        self.log_enq = 0  # records the producer logged (D12); not part of barriers
        self.log_done = 0
        self.log_wait_target: int | None = None
        self.scope: anyio.CancelScope | None = None
        self.thread: threading.Thread | None = None
        self.peak = 0
        self.busy = 0.0
        self.busy_mark = 0.0
        self.slow_batches = 0
        self.last_batch = 0

    def take(self) -> tuple[Any, ...] | None:
        """The next item, or ``None`` after marking the lane idle.

        The queue is checked again after ``idle`` is set, so an item appended by a thread
        that saw the lane busy is never left behind (a spare wake-up costs one empty pass).
        """
        pending = self.pending
        while True:
            try:
                return pending.popleft()
            except IndexError:
                self.idle = True
                if not pending:
                    return None
                self.idle = False

    def statistics_slots(self) -> list[Slot]:
        slots = list(self.slots.values())
        if self.log_slot is not None:
            slots.append(self.log_slot)
        return slots


# -- drivers ---------------------------------------------------------------------------------


def finish_event(
    bus: EventBus, lane: Lane, slot: Slot, view: Any, elapsed: float, *, skipped: bool = False
) -> None:
    """Account a finished (or, once the bus stops, skipped) event item of ``lane``."""
    if not skipped:
        slot.account(elapsed)
        lane.busy += elapsed
        lane.last_batch = view._ts._batch
        if bus.trace is not None:
            bus.trace.handler(lane.name, slot.event, _perf() - elapsed, elapsed)
    count_done(bus, lane)


def count_log_done(bus: EventBus, lane: Lane) -> None:
    """Count one delivered record the producer counted in ``lane.log_enq``."""
    lane.log_done += 1
    target = lane.log_wait_target
    if target is not None and lane.log_done >= target:
        bus._reached(lane)


def count_done(bus: EventBus, lane: Lane) -> None:
    """Count one finished item the producer counted in ``lane.enq``."""
    lane.done += 1
    target = lane.wait_target
    if target is not None and lane.done >= target:
        bus._reached(lane)


def thread_driver(bus: EventBus, lane: Lane) -> None:
    """Body of a thread lane: run items until a STOP item.

    The lane's lock is held while taking an item and running it, never while sleeping: the
    training thread, holding the same lock while the lane is idle, may run the lane's cheap
    items itself without either of them running two items at once or out of order.
    """
    tokens = lane.tokens
    lock = lane.exec_lock
    while True:
        with lock:
            item = lane.take()
            if item is not None:
                kind = item[0]
                if kind == STOP:
                    return
                _run_thread_item(bus, lane, item, kind)
        if item is None:
            tokens.get()


def _run_thread_item(bus: EventBus, lane: Lane, item: tuple[Any, ...], kind: int) -> None:
    if kind == EVENT:
        _, slot, view, logger = item
        if bus.stopping:
            finish_event(bus, lane, slot, view, 0.0, skipped=True)
            return
        t0 = _perf()
        try:
            if slot.is_async:
                bus._await_from_thread(lane, slot.fn, view, logger, cancellable=True)
            else:
                slot.fn(view, logger)
        except BaseException as exc:
            bus._fail(exc, slot.handler, slot.event)
        elapsed = _perf() - t0
        inline_max = bus.inline_max
        if inline_max and not slot.is_async and not slot.inline_banned:
            slot.inline_ok = elapsed <= inline_max
            slot.inline_banned = not slot.inline_ok
        finish_event(bus, lane, slot, view, elapsed)
    elif kind == LOG:
        _deliver_sync(bus, lane, item[1])
        if item[2]:
            count_log_done(bus, lane)
    else:  # CALL
        _, fn, is_async, on_done = item
        error: BaseException | None = None
        try:
            if is_async:
                bus._await_from_thread(lane, fn)
            else:
                fn()
        except BaseException as exc:
            error = exc
        bus.loop.call_soon(on_done, error)


def drain_broken(bus: EventBus, lane: Lane, error: BaseException) -> None:
    """After an internal error in a lane thread: account items without running them.

    Nobody may wait forever on a lane that can no longer run handlers: events and counted
    records are counted as done, ``CALL`` items fail with ``error``, ``STOP`` ends it.
    """
    while True:
        item = lane.take()
        if item is None:
            lane.tokens.get()
            continue
        kind = item[0]
        if kind == EVENT:
            count_done(bus, lane)
        elif kind == LOG and item[2]:
            count_log_done(bus, lane)
        elif kind == CALL:
            bus.loop.call_soon(item[3], error)
        elif kind == STOP:
            return


def _deliver_sync(bus: EventBus, lane: Lane, record: LogRecord) -> None:
    slot = lane.log_slot
    assert slot is not None
    t0 = _perf()
    try:
        record.resolve()
        if slot.is_async:
            bus._await_from_thread(lane, slot.fn, record)
        else:
            slot.fn(record)
    except BaseException as exc:
        bus._fail(exc, slot.handler, None)
    slot.account(_perf() - t0)
