"""Publishing: what the training thread does when it publishes an event.

:meth:`Producer.publish` runs on the training thread. For each event it builds one item (a
snapshot of the state, D5) and, for every callback that handles the event, in list order:

- a plain ``@blocking`` handler runs right here, once its callback's earlier items are done
  (D9); an ``async def`` ``@blocking`` handler is queued and waited for;
- any other handler's item is appended to its lane, after waiting for room if the lane
  holds ``queue_size`` items (D12): a thread lane's ``queue.put`` (which wakes its thread
  if it sleeps), or a loop lane's ``pending`` (asking the loop to wake the lane's task if
  it sleeps, ``bridge.LoopWaker``).

At a barrier event it then waits at the gate for what the barrier waits for (D4, with each
lane's lag). Nothing here depends on how long anything took.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from trainbus.bus.lanes import EventItem, Stopped
from trainbus.bus.members import due
from trainbus.bus.runners import account
from trainbus.bus.slow import SlowCallbacks
from trainbus.core.events import Event

if TYPE_CHECKING:
    from trainbus.bus.bridge import LoopWaker
    from trainbus.bus.lanes import Counters, Gate, Lane
    from trainbus.bus.members import Member, Slot
    from trainbus.bus.options import BusOptions
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["Producer"]

_perf = time.perf_counter


class Producer:
    """Publishing, barriers and backpressure for one session (training thread)."""

    def __init__(
        self,
        *,
        state: State,
        logger: Logger,
        members: Sequence[Member],
        lanes: Sequence[Lane],
        options: BusOptions,
        gate: Gate,
        counters: Counters,
        waker: LoopWaker,
        warn: Callable[[str, object], None],
    ) -> None:
        self.state = state
        self.logger = logger
        self.members = members
        self.lanes = lanes
        self.barriers = options.barriers
        self.queue_size = options.queue_size
        self.warn_slow = options.warn_slow
        self.gate = gate
        self.counters = counters
        self.waker = waker
        self.warn = warn
        self.destinations = [lane for lane in lanes if lane.log_slot is not None]
        self.lagged = [lane for lane in lanes if not lane.uniform]
        #: Per event, its handlers in offering order (loggers first at INIT, last
        #: otherwise, as Composer does).
        self.plan: dict[Event, list[tuple[Lane, Slot]]] = {}
        for event in Event:
            subs = [(lane, lane.slots[event]) for lane in lanes if event in lane.slots]
            if event is Event.INIT:
                subs.sort(key=lambda pair: pair[0].log_slot is None)
            self.plan[event] = subs
        #: The thread that may publish now (the training thread, or a plain-code caller).
        self.ident: int | None = None
        self._view_key: tuple[Any, Any] = (None, None)
        self._view: tuple[State, Logger] | None = None
        self._trace_mark = 0.0
        #: While set, every event is published as a barrier that waits for every handler.
        self._barrier_all = False
        #: The lane whose @blocking handler runs on this thread now (its records and
        #: ``wait_all`` must not wait for itself).
        self.running_here: Lane | None = None
        self.slow = SlowCallbacks()

    def is_producer(self) -> bool:
        """Whether the calling thread is the one publishing."""
        return threading.get_ident() == self.ident

    # -- publishing ------------------------------------------------------------------------

    def publish(self, *events: Event) -> None:
        """Offer each event, in order, to every callback that handles it.

        Events published together (nothing computed between them) share one snapshot.

        Raises:
            Stopped: The session is stopping; the training thread should unwind.
        """
        gate = self.gate
        if gate.stopping:
            raise Stopped
        queue_size = self.queue_size
        for event in events:
            self.counters.published += 1
            item: EventItem | None = None
            for lane, slot in self.plan[event]:
                if item is None:
                    item = self._item(event)
                when = slot.when
                if when is not None and not due(slot, when, item.view.timestamp):
                    continue
                if slot.here:  # a plain @blocking handler: run it now, on this thread (D9)
                    self._run_here(lane, slot, item)
                    continue
                # Queue it on its lane (D3): an append, and a wake-up if its runner sleeps.
                if lane.enq - lane.done >= queue_size:  # D12: wait for room first
                    gate.wait([(lane, lane.enq - queue_size + 1)], "backpressure", event)
                lane.enq += 1  # before the item: its runner never counts past enq
                if not lane.uniform:
                    lane.last_by_lag[slot.lag] = lane.enq
                if lane.on_thread:
                    lane.queue.put(item)
                else:
                    lane.pending.append(item)  # then look at idle: see LoopWaker
                    if lane.idle and not lane.wake_requested:
                        self.waker.wake(lane)
                if slot.is_blocking:  # an async @blocking handler: wait for it (D9)
                    gate.wait([(lane, lane.enq)], "blocking", event)
            if event is Event.BATCH_END:
                self._batch_end()
            if self._barrier_all or event in self.barriers:
                self._barrier(event)
                if event is Event.BATCH_END and self.counters.trace is not None:
                    self._trace_mark = _perf()  # the next batch's span starts after the wait
            if gate.stopping:
                raise Stopped

    def _item(self, event: Event) -> EventItem:
        """The event's item, with a snapshot shared by events with nothing between them."""
        state = self.state
        ts = state._timer._ts
        key = (state._frame, ts)
        cached = self._view_key
        if key[0] is not cached[0] or key[1] is not cached[1] or self._view is None:
            view = state.snapshot()
            self._view = (view, self.logger._bind(view))
            self._view_key = key
        view, logger = self._view
        return EventItem(event, view, logger, ts._batch)

    def _run_here(self, lane: Lane, slot: Slot, item: EventItem) -> None:
        """Run a plain ``@blocking`` handler on this thread, after its lane's backlog (D9).

        A callback with a thread of its own may run something there now (a record): the
        handler then waits for the lane's earlier items and runs under the lane's lock
        (D1). A callback without a thread runs nothing unless it has queued items.
        """
        gate = self.gate
        locked = lane.on_thread or lane.done < lane.enq
        if locked:
            event = item.event
            if lane.done < lane.enq:
                gate.wait([(lane, lane.enq)], "blocking", event)
            if lane.log_done < lane.log_enq:  # records logged before the event first (D1)
                gate.wait([(lane, lane.log_enq)], "records", event)
            if gate.stopping:
                raise Stopped
            lane.lock.acquire()
        self.running_here = lane
        lane.current = slot.qualname
        t0 = _perf()
        try:
            slot.fn(item.view, item.logger)
        except BaseException as exc:
            gate.fail(exc, slot.handler, item.event, lane)
        finally:
            if locked:
                lane.lock.release()
        elapsed = _perf() - t0
        lane.current = self.running_here = None
        slot.here_calls += 1
        account(lane, slot, item.batch, t0, elapsed, self.counters)

    # -- barriers --------------------------------------------------------------------------

    def _batch_end(self) -> None:
        counters = self.counters
        counters.batches += 1
        batches = counters.batches
        trace = counters.trace
        if trace is not None:
            now = _perf()
            mark = self._trace_mark or trace.origin
            trace.producer_span(f"batch {batches}", mark, now - mark)
        for lane in self.lagged:
            lane.mark_batch_end(batches)
        if self.warn_slow and self.slow.checking:
            self.slow.at_batch_end(self.members, counters, self.warn)

    def _barrier(self, event: Event) -> None:
        """Wait for what this barrier waits for (D4, with lags); under :meth:`run_now`, for
        every item."""
        batches = self.counters.batches
        targets = []
        for lane in self.lanes:
            if lane.uniform:
                target = lane.enq
            else:
                target = lane.barrier_target(batches)  # drops the marks that fall due
                if self._barrier_all:
                    target = lane.enq
            if lane.done < target:
                targets.append((lane, target))
        if targets:
            self.gate.wait(targets, "barrier", event)

    def run_now(self, event: Event) -> None:
        """Publish ``event`` as a barrier that waits for every handler (plain-code callers)."""
        self._barrier_all = True
        try:
            self.publish(event)
        finally:
            self._barrier_all = False

    def wait_all(self, *, records: bool = False) -> None:
        """Block until every handler published so far has finished, and with ``records``
        until every destination has taken every record logged so far."""
        targets = [(lane, lane.enq) for lane in self.lanes if lane.done < lane.enq]
        if targets:
            self.gate.wait(targets, "barrier")
        if records:
            own = self.running_here  # the @blocking handler's lane that asks, if any
            logged = [
                (lane, lane.log_enq)
                for lane in self.destinations
                if lane.log_done < lane.log_enq and lane is not own
            ]
            if logged:
                self.gate.wait(logged, "records")
        if self.gate.stopping:
            raise Stopped
