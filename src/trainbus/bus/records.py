"""Logged records: queued on every destination, within each one's bound (D12).

``logger.log_metrics(...)`` (any thread) hands its record to :meth:`Records.submit`, which
queues it on every destination's worker (a lossy one's in its ``mailbox.py``). Past a
destination's bound the logging party waits as its thread allows: the training thread at the
gate, a lane thread on the spot, a handler on the loop after it returns
(``Worker._wait_for_room``); nobody where waiting could never end (``would_deadlock``).
Barriers never wait for records. The rule in full: ``docs/concurrency.md``, D12.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from trainbus.bus.mailbox import FULL, WAKE
from trainbus.bus.queue import LogItem
from trainbus.bus.worker import CURRENT_WORKER, Lane, wake_on_loop, would_deadlock

if TYPE_CHECKING:
    from trainbus.bus.counters import Counters
    from trainbus.bus.producer import Producer
    from trainbus.bus.queue import Gate
    from trainbus.bus.worker import Worker
    from trainbus.core.logger import LogRecord

__all__ = ["Records"]


class Records:
    """The record intake of one session. Invariant: its fields are set once, by ``__init__``;
    any thread submits."""

    def __init__(self, lanes: Sequence[Lane], gate: Gate, counters: Counters,
                 call_soon: Callable[..., Any], loop_thread: int, producer: Producer) -> None:
        self.destinations = [lane for lane in lanes if lane.log_slot is not None]
        self.gate = gate
        self.counters = counters
        self.call_soon = call_soon
        self.loop_thread = loop_thread
        self._producer = producer

    def submit(self, record: LogRecord) -> None:
        """Queue ``record`` on every destination and wake those that sleep: from the publishing
        thread a loop worker's record rides the loop's next hand-over (D1; at once when a
        ``@blocking`` handler logs it), from any other thread one call into the loop wakes them."""
        woken: list[Worker] = []
        owed = False
        producer = self._producer
        publishing = producer.is_producer()
        for lane in self.destinations:
            counts = lane.records
            box = lane.mailbox
            if box is not None:  # a lossy destination: its records wait in its mailbox
                answer = box.offer(record)
                if answer == FULL:  # coalesce, and nothing to merge with: wait, as block
                    self._wait_for_room(lane)
                    answer = box.offer(record, force=True)
                depth = box.depth
                item = LogItem(None, lane) if answer == WAKE else None  # the marker, once
            else:
                full = counts.enq - counts.done >= counts.bound
                if full and not (lane.failed or lane.abandoned):
                    self._wait_for_room(lane)
                depth = counts.count()
                item = LogItem(record, lane)
            if item is not None:
                worker = lane.worker
                if worker.on_thread:
                    worker.put(item)
                elif publishing:
                    worker.queue.inbox.append(item)
                    producer.owe_loop()
                    owed = True
                else:
                    worker.queue.items.append(item)
                    if worker.idle:
                        woken.append(worker)
            member = lane.member
            if depth > member.peak_records:
                member.peak_records = depth
        if owed and producer.running_here is not None:  # a @blocking handler may wait
            producer.hand_over()
        if woken:
            try:
                self.call_soon(wake_on_loop, woken, self.counters)
            except Exception:  # the loop has ended (a thread logged after the session)
                return

    def _wait_for_room(self, lane: Lane) -> None:
        ident = threading.get_ident()
        counts = lane.records
        if ident == self._producer.ident:
            if self._producer.running_here is not lane:  # not a @blocking handler's own
                self._producer.wait([(counts, counts.enq - counts.bound + 1)], "records")
            return
        waiter = CURRENT_WORKER.get()  # the worker whose handler logs, if any
        if ident == self.loop_thread:
            if waiter is not None and not waiter.on_thread and lane not in waiter.lanes:
                waiter.lanes[0].owes = lane  # its task waits for room after this handler
            return
        if would_deadlock(waiter, lane):  # its own lane thread, or a cycle
            return
        if waiter is not None:
            waiter.waiting_on = lane
        try:
            counts.wait_for_room(
                lambda: self.gate.stopping or lane.failed or lane.abandoned
                or would_deadlock(waiter, lane)
            )
        finally:
            if waiter is not None:
                waiter.waiting_on = None
