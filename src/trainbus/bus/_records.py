"""Logged records: every destination's bound (D12), whoever logs them.

A record is queued on every destination's lane. At most ``queue_size`` records wait per
destination; past that the logging party waits, the way publishing waits for a full lane:

- the training thread waits through the gate (a barrier-like wait, bounded by stopping);
- a lane's thread (a plain handler that logs) blocks on the destination's condition;
- a handler on the event loop (``async def``) cannot block the loop: its record is queued,
  and the loop lane it runs in *owes* the wait. Its dispatcher pauses that lane after the
  handler returns, until the destination has room (``Dispatcher._pay``); the paused lane's
  own queue then fills and the training thread waits for it. The overshoot is bounded by
  what one handler call logs.

Nobody waits for a lane it runs itself, for a lane the training thread has claimed, or
when waiting would close a cycle of lanes waiting for each other's room (two destinations
logging into each other): then the record is queued over the bound and the wait skipped
(``would_deadlock``). Barriers never wait for records.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from trainbus.bus._eligibility import learn
from trainbus.bus._items import LogItem
from trainbus.bus._lane import CLAIMED, would_deadlock
from trainbus.core.scalars import all_ready

if TYPE_CHECKING:
    from trainbus.bus._dispatcher import Dispatcher
    from trainbus.bus._gate import Gate
    from trainbus.bus._lane import Lane
    from trainbus.core.logger import LogRecord

__all__ = ["RECORD_BUDGET", "RECORD_BURST", "Records", "run_records_here"]

_perf = time.perf_counter

#: At most this many records wait in a destination's lane without waking it (at most half
#: the bound); they wait at most ``RECORD_DEFER_MAX`` (``_inline.py``), and a wait for them
#: wakes them at once.
RECORD_BURST = 64
#: A burst of records run on the producer stops after this many times ``inline_max``.
RECORD_BUDGET = 64


class Records:
    """The record intake of one session (any thread)."""

    def __init__(
        self,
        lanes: Sequence[Lane],
        bound: int,
        gate: Gate,
        dispatcher: Dispatcher,
        producer_ident: Callable[[], int | None],
        producer_wait: Callable[[list[tuple[Lane, int]], str], None],
        defer: Callable[[Lane], bool] | None = None,
        here: Callable[[Lane], bool] | None = None,
    ) -> None:
        self.lanes = lanes
        self.destinations = [lane for lane in lanes if lane.log_slot is not None]
        self.bound = bound
        self.gate = gate
        self.dispatcher = dispatcher
        self._producer_ident = producer_ident
        self._producer_wait = producer_wait
        #: Lists a destination whose records wait unwoken (``InlinePath.defer_records``).
        self.defer = defer
        #: Runs a cheap destination's records on the producer (``InlinePath.run_records``).
        self.here = here
        #: Records that may wait unwoken per destination: a destination is woken at this
        #: many (well below the bound, so nobody waits for room in a sleeping lane).
        self.burst = max(1, min(RECORD_BURST, bound // 2))

    def submit(self, record: LogRecord) -> None:
        """Queue ``record`` on every destination's lane, within each one's bound."""
        item = LogItem(record)
        bound = self.bound
        ident = threading.get_ident()
        defer, burst = self.defer, self.burst
        here = self.here if ident == self._producer_ident() else None
        for lane in self.destinations:
            if lane.log_enq - lane.log_done >= bound and not (lane.failed or lane.abandoned):
                self._wait_for_room(lane, ident)
            lane.add_record(item, defer, burst, here)
            depth = lane.log_enq - lane.log_done
            member = lane.member
            if depth > member.peak_records:
                member.peak_records = depth

    def _wait_for_room(self, lane: Lane, ident: int) -> None:
        if lane.state == CLAIMED:  # the training thread runs that lane's items now
            return
        if ident == self._producer_ident():
            self._producer_wait([(lane, lane.log_enq - self.bound + 1)], "records")
        elif ident == self.dispatcher.loop.thread_id:
            running = self.dispatcher.running
            if running is not None and running is not lane:
                running.owes = lane  # its dispatcher pauses it after this handler
        else:
            waiter = self._lane_of_thread(ident)
            if waiter is lane or would_deadlock(waiter, lane):
                return
            if waiter is not None:
                waiter.waiting_on = lane
            try:
                lane.wait_for_room(self.bound, lambda: self._give_up(waiter, lane))
            finally:
                if waiter is not None:
                    waiter.waiting_on = None

    def _give_up(self, waiter: Lane | None, lane: Lane) -> bool:
        if self.gate.stopping or lane.failed or lane.abandoned:
            return True
        return would_deadlock(waiter, lane)

    def _lane_of_thread(self, ident: int) -> Lane | None:
        for lane in self.lanes:
            thread = lane.thread
            if thread is not None and thread.ident == ident:
                return lane
        return None


def run_records_here(lane: Lane, gate: Gate, inline_max: float) -> bool:
    """Run an idle destination's leading records on this thread, the producer; return
    whether it did (else the caller wakes the lane).

    Only for a cheap plain ``log_record`` (``inline_ok``, learnt on the lane's thread),
    and only records whose values are ready (D14: the producer never waits for a device
    copy; the first one not ready stops the run, and the lane's thread takes the rest).
    Records come in bursts (``RECORD_BURST``, ``RECORD_DEFER_MAX``), so this saves a thread
    wake-up per burst, and the GIL hand-offs with it, for a few microseconds of the
    producer's time per record.

    A burst is judged as a whole, by its mean call (:func:`learn`): a call that handed the
    GIL to another thread (the handler woke it, as a batching logger wakes its sender)
    looks slow by itself, yet costs the producer nothing it would not wait for anyway. A
    burst stops once it took ``RECORD_BUDGET`` times ``inline_max``; the lane's thread runs
    (and judges, call by call) the rest.
    """
    slot = lane.log_slot
    if (
        slot is None or slot.is_async or not slot.inline_ok or not lane.on_thread
        or gate.stopping or not lane.try_claim(allow_pending=True)
    ):
        return False
    pending = lane.pending
    calls = 0
    start = t0 = _perf()
    budget = start + RECORD_BUDGET * inline_max
    try:
        while pending and t0 < budget and not gate.stopping:
            item = pending[0]
            if item.__class__ is not LogItem:
                break
            record = item.record
            if not record._resolved and not all_ready(record.metrics):
                break
            pending.popleft()
            if not lane.failed:  # a failed destination gets no more records (D10)
                lane.current = slot.qualname
                try:
                    slot.fn(record.resolve())
                except BaseException as exc:
                    gate.fail(exc, slot.handler, None, lane)
                t1 = _perf()
                slot.account(t1 - t0)
                t0 = t1
                lane.current = None
                calls += 1
            lane.count_log_done()
    finally:
        if calls:  # before the release: then the lane's thread may write the slot
            slot.inline_calls += calls
            learn(slot, (t0 - start) / calls, inline_max)
        lane.release()
    return True
