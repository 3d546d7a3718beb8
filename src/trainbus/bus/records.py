"""Logged records: queued on every destination, within each one's bound (D12).

``logger.log_metrics(...)`` (any thread) hands its record to :meth:`Records.submit`, which
queues it on every destination's lane. At most ``log_limit`` records wait per destination
(its ``backpressure`` limit, else ``queue_size``); past that the logging party waits, in
the way its thread allows:

- the training thread waits at the gate, like a full event queue;
- a lane thread (a plain handler that logs) blocks until the destination has room;
- a handler on the event loop cannot block the loop: its record is queued, and its lane
  waits for room after the handler returns (``runners._wait_for_room``). The overshoot is
  bounded by what one handler call logs.

Nobody waits where waiting could never end: for room in its own lane or in a destination
pinned to its own lane thread, or where waiting would close a cycle of runners (lane
threads, loop lanes' tasks) waiting for each other's room: then the record is queued over
the bound. Barriers never wait for records.

A destination with a lossy policy (``drop_oldest``, ``latest``, ``coalesce``) gets its
records in its mailbox instead (``mailbox.py``), which drops or merges rather than waits;
only ``coalesce`` waits, as above, for a record it cannot merge.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from trainbus.bus.lanes import Lane, LogItem, would_deadlock
from trainbus.bus.mailbox import FULL, WAKE
from trainbus.bus.runners import CURRENT_RUNNER

if TYPE_CHECKING:
    from trainbus.bus.bridge import LoopWaker
    from trainbus.bus.lanes import Gate
    from trainbus.bus.pool import LaneThread
    from trainbus.bus.producer import Producer
    from trainbus.core.logger import LogRecord

__all__ = ["Records"]


class Records:
    """The record intake of one session (any thread).

    Invariant: its own fields are set once; what :meth:`submit` writes is the lanes' and
    ``Member.peak_records``, each by its owner's rule (``lanes.py``, ``members.py``).
    """

    def __init__(
        self,
        lanes: Sequence[Lane],
        gate: Gate,
        waker: LoopWaker,
        loop_thread: int,
        producer: Producer,
    ) -> None:
        self.destinations = [lane for lane in lanes if lane.log_slot is not None]
        self.gate = gate
        self.waker = waker
        self.loop_thread = loop_thread
        self._producer = producer

    def submit(self, record: LogRecord) -> None:
        """Queue ``record`` on every destination's lane, within each one's bound, and wake
        the sleeping destinations: from a thread other than the publishing one at once
        (one call into the loop for all the loop lanes).

        On the publishing thread a loop lane's record goes into its inbox, after the events
        published before it (D1), and rides the loop's next wake-up (``producer.WAKES_LOOP``);
        logged by a ``@blocking`` handler (which may wait for it), it is handed over at once."""
        item = LogItem(record)
        woken: list[Lane] = []
        owed = False
        producer = self._producer
        publishing = producer.is_producer()
        for lane in self.destinations:
            box = lane.mailbox
            if box is not None:  # a lossy destination: its records wait in its mailbox
                answer = box.offer(record)
                if answer == FULL:  # coalesce, and nothing to merge with: wait, as block
                    self._wait_for_room(lane)
                    answer = box.offer(record, force=True)
                depth = box.depth
                # the mailbox was empty: its runner gets a marker (else one is queued)
                queued = LogItem(None) if answer == WAKE else None
            else:
                if lane.log_enq - lane.log_done >= lane.log_limit and not (
                    lane.failed or lane.abandoned
                ):
                    self._wait_for_room(lane)
                depth = lane.count_record()
                queued = item
            if queued is not None:
                if lane.thread is not None:
                    lane.thread.put(lane, queued)
                elif publishing:
                    lane.inbox.append(queued)
                    owed = True
                else:
                    lane.pending.append(queued)
                    if lane.idle:
                        woken.append(lane)
            member = lane.member
            if depth > member.peak_records:
                member.peak_records = depth
        if owed:
            if producer.running_here is not None:  # a @blocking handler may wait for it
                producer.hand_over()
            else:
                producer.owe_loop()
        if woken:
            self.waker.wake(woken)

    def _wait_for_room(self, lane: Lane) -> None:
        ident = threading.get_ident()
        if ident == self._producer.ident:
            if self._producer.running_here is not lane:  # not a @blocking handler's own
                self._producer.wait_records([(lane, lane.log_enq - lane.log_limit + 1)])
            return
        waiter = CURRENT_RUNNER.get()  # this lane thread, or (on the loop) this loop lane
        if ident == self.loop_thread:
            if isinstance(waiter, Lane) and waiter is not lane:
                waiter.owes = lane  # its task waits for room after this handler
            return
        if would_deadlock(waiter, lane):  # its own lane thread, or a cycle
            return
        if waiter is not None:
            waiter.waiting_on = lane
        try:
            lane.wait_for_room(lane.log_limit, lambda: self._give_up(waiter, lane))
        finally:
            if waiter is not None:
                waiter.waiting_on = None

    def _give_up(self, waiter: LaneThread | Lane | None, lane: Lane) -> bool:
        if self.gate.stopping or lane.failed or lane.abandoned:
            return True
        return would_deadlock(waiter, lane)
