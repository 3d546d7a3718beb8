"""The producer side of a session: what the training thread does when it publishes.

``publish`` runs on the training thread and never touches the event loop except to wake
it, at most once per burst. It queues each event's item on the lanes of the callbacks that
handle it, runs what must run before it returns (``@blocking`` handlers, the inline fast
path at barriers), and at barrier events waits, through the gate, for what the barrier
waits for (D4, with each lane's lag). Records are taken in ``_records.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from trainbus.bus._items import EventItem
from trainbus.bus._lane import CLAIMED, IDLE
from trainbus.bus._running import call_plain
from trainbus.bus._slot import due
from trainbus.bus._slow import SlowCallbacks
from trainbus.bus._stopped import Stopped
from trainbus.core.events import Event

if TYPE_CHECKING:
    from trainbus.bus._dispatcher import Dispatcher
    from trainbus.bus._gate import Gate
    from trainbus.bus._inline import InlinePath
    from trainbus.bus._lane import Lane
    from trainbus.bus._options import BusOptions
    from trainbus.bus._slot import Member, Slot
    from trainbus.bus._statistics import Counters
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
        inline: InlinePath,
        dispatcher: Dispatcher,
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
        self.inline = inline
        self.dispatcher = dispatcher
        self.warn = warn
        self.destinations = [lane for lane in lanes if lane.log_slot is not None]
        self.lagged = [lane for lane in lanes if not lane.uniform]
        #: Per event, its handlers in offering order, cut into runs of handlers of
        #: exclusive lanes (``_lane.py``; run here by ``_run_exclusive``) and runs of the
        #: others (``_offer``): ``(exclusive, pairs)``.
        self.plan: dict[Event, list[tuple[bool, list[tuple[Lane, Slot]]]]] = {}
        for event in Event:
            subs = [(lane, lane.slots[event]) for lane in lanes if event in lane.slots]
            if event is Event.INIT:  # loggers first at INIT, last otherwise (Composer)
                subs.sort(key=lambda pair: pair[0].log_slot is None)
            plan: list[tuple[bool, list[tuple[Lane, Slot]]]] = []
            for lane, slot in subs:
                if not plan or plan[-1][0] is not lane.exclusive:
                    plan.append((lane.exclusive, []))
                plan[-1][1].append((lane, slot))
            self.plan[event] = plan
        #: The thread that may publish now (the training thread, or a plain-code caller).
        self.ident: int | None = None
        # Lanes this burst moved to ACTIVE, not woken yet (once per burst, before any wait).
        self._to_kick: list[Lane] = []
        self._view_key: tuple[Any, Any] = (None, None)
        self._view: tuple[State, Logger] | None = None
        self._trace_mark = 0.0
        #: While set, every event is published as a barrier (``run_now``).
        self._barrier_all = False
        self._event: Event | None = None  # the barrier event waited at (for warnings)
        self.slow = SlowCallbacks()

    def is_producer(self) -> bool:
        """Whether the calling thread is the one publishing."""
        return threading.get_ident() == self.ident

    # -- publishing ------------------------------------------------------------------------

    def publish(self, *events: Event) -> None:
        """Offer each event, in order, to every callback that handles it.

        Events published together (nothing computed between them) share one snapshot
        of the state and wake each lane at most once.

        Raises:
            Stopped: The session is stopping; the producer should unwind.
        """
        gate = self.gate
        if gate.stopping:
            raise Stopped
        inline = self.inline
        if (inline.lanes or inline.record_lanes) and inline.overdue():
            inline.flush_overdue()
        try:  # lanes made ACTIVE must be woken even when Stopped unwinds the burst
            for event in events:
                self.counters.published += 1
                plan = self.plan[event]
                barrier = self._barrier_all or event in self.barriers
                if barrier and inline.lanes:
                    self._kick()
                    inline.flush(run=True)
                for exclusive, pairs in plan:
                    if exclusive:
                        self._run_exclusive(pairs, self._item(event))
                    else:
                        self._offer(event, pairs, barrier)
                if event is Event.BATCH_END:
                    self._batch_end()
                if barrier:
                    self._kick()
                    self._event = event
                    self._barrier()
                    if event is Event.BATCH_END:
                        self._trace_mark = _perf()
                if gate.stopping:
                    raise Stopped
        finally:
            self._kick()

    def _offer(self, event: Event, subs: list[tuple[Lane, Slot]], barrier: bool) -> None:
        item = self._item(event)
        queue_size = self.queue_size
        here: list[tuple[Lane, Slot]] | None = None
        for lane, slot in subs:
            when = slot.when
            if when is not None and not due(slot, when, item.view.timestamp):
                continue
            if slot.inline_ok and not (barrier and slot.is_async):
                if barrier:
                    if here is None:
                        here = []
                    here.append((lane, slot))
                elif lane.state == IDLE and lane.enq - lane.done < queue_size:
                    lane.pending.append(item)  # D3: queued unwoken (``_inline.py``);
                    lane.enq += 1  # ``_append``, written out
                    if not lane.uniform:
                        lane.last_by_lag[slot.lag] = lane.enq
                    depth = lane.enq - lane.done
                    if depth > lane.member.peak:
                        lane.member.peak = depth
                    if not lane.deferred:
                        self.inline.defer(lane)
                else:
                    self._enqueue(lane, slot, item)
            elif slot.is_blocking:
                if slot.is_async or not self._run_blocking_here(lane, slot, item):
                    self._blocking(lane, slot, item)
            elif lane.enq - lane.done >= queue_size or not lane.uniform:
                self._enqueue(lane, slot, item)  # waits for room first (D12), or lags
            else:  # _enqueue's common case, written out (once per handler per event)
                lane.pending.append(item)
                lane.enq += 1
                depth = lane.enq - lane.done
                member = lane.member
                if depth > member.peak:
                    member.peak = depth
                if lane.state == IDLE and lane.activate():
                    self._to_kick.append(lane)
        if here is not None:
            self._kick()  # the other lanes run while these run here (D2)
            for lane, slot in self.inline.run_here(here, item):
                self._enqueue(lane, slot, item)

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

    def _append(self, lane: Lane, slot: Slot, item: EventItem) -> None:
        lane.pending.append(item)
        lane.enq += 1
        if not lane.uniform:
            lane.last_by_lag[slot.lag] = lane.enq
        depth = lane.enq - lane.done
        member = lane.member
        if depth > member.peak:
            member.peak = depth

    def _enqueue(self, lane: Lane, slot: Slot, item: EventItem) -> None:
        if lane.enq - lane.done >= self.queue_size:  # D12: wait for room
            self._wait([(lane, lane.enq - self.queue_size + 1)], "backpressure", item.event)
        self._append(lane, slot, item)
        if lane.state == IDLE and lane.activate():
            self._to_kick.append(lane)

    def _run_exclusive(self, pairs: list[tuple[Lane, Slot]], item: EventItem) -> None:
        """The hot path of D9: run the ``@blocking`` handlers of exclusive lanes here.

        No lock: only the producer moves an exclusive lane out of IDLE (``_lane.py``). Written
        out (as ``call_plain``, ``Slot.account``, ``Lane.release``): it runs per handler per
        event. Not counted in enq/done (each call ends before anything could wait for it) nor
        in ``inline_calls`` (the statistics know these all run here). One clock read a call,
        so a call's time includes this loop's own step (well under a microsecond).
        """
        if self._to_kick:
            self._kick()  # what this burst queued runs while these run here
        gate = self.gate
        view, logger, batch = item.view, item.logger, item.batch
        trace = self.counters.trace
        t0 = _perf()
        for lane, slot in pairs:
            if gate.stopping:
                raise Stopped
            if lane.state != IDLE or lane.pending:  # not while publishing; be safe anyway
                self._blocking(lane, slot, item)
                t0 = _perf()
                continue
            lane.state = CLAIMED
            lane.current = slot.qualname
            try:
                slot.fn(view, logger)
            except BaseException as exc:
                gate.fail(exc, slot.handler, slot.event, lane)
            t1 = _perf()
            elapsed = t1 - t0
            t0 = t1
            lane.current = None
            lane.state = IDLE
            slot.calls += 1
            slot.total_time += elapsed
            if elapsed > slot.max_time:
                slot.max_time = elapsed
            lane.last_batch = batch
            if trace is not None:
                trace.handler(lane.name, slot.event, t1 - elapsed, elapsed)

    def _run_blocking_here(self, lane: Lane, slot: Slot, item: EventItem) -> bool:
        """Run a plain ``@blocking`` handler on an idle, empty lane here (one lock); return
        false, having done nothing, if the lane is busy or holds items (:meth:`_blocking`)."""
        if lane.state != IDLE or lane.pending:
            return False
        with lane.lock:
            if lane.state != IDLE or lane.pending:
                return False
            lane.state = CLAIMED
        try:
            if self._to_kick:
                self._kick()  # what this burst queued runs while the handler runs here
            if self.gate.stopping:  # its lane skips what it had queued; so does this one
                raise Stopped
            self._call_claimed(lane, slot, item)
        finally:
            lane.state = IDLE  # Lane.release, written out
            if lane.pending:
                lane.wake()
        return True

    def _blocking(self, lane: Lane, slot: Slot, item: EventItem) -> None:
        """Run a ``@blocking`` handler before returning (D9), after the lane's backlog."""
        if slot.is_async:  # coroutines run on the loop: queue it, wait for this very item
            self._enqueue(lane, slot, item)
            self._wait([(lane, lane.enq)], "blocking", item.event)
            return
        self._kick()  # what this burst queued runs while the handler runs here
        if not lane.try_claim():  # the lane is busy: wait for it to be handed over
            self.gate.claim(lane, item.event)  # every earlier item is done, nothing runs there
        try:
            if self.gate.stopping:  # its lane skips what it had queued; so does this handler
                raise Stopped
            self._call_claimed(lane, slot, item)
        finally:
            lane.release()

    def _call_claimed(self, lane: Lane, slot: Slot, item: EventItem) -> None:
        """Run a plain handler of a lane this thread has claimed, and account for it.

        Not counted in enq/done: it runs to completion before anything could wait for it
        (so a handler that waits for every other handler does not wait for itself).
        """
        lane.current = slot.qualname
        elapsed = call_plain(self.gate, lane, slot, item)
        lane.current = None
        slot.inline_calls += 1
        slot.account(elapsed)
        lane.last_batch = item.batch
        trace = self.counters.trace
        if trace is not None:
            trace.handler(lane.name, slot.event, _perf() - elapsed, elapsed)

    def _kick(self) -> None:
        """Wake the drivers of the lanes this burst made ACTIVE."""
        lanes = self._to_kick
        if not lanes:
            return
        dispatcher = self.dispatcher
        loop_lanes = False
        for lane in lanes:
            if lane.on_thread:
                lane.tokens.put(None)
            else:
                dispatcher.schedule(lane)
                loop_lanes = True
        lanes.clear()
        if loop_lanes:
            dispatcher.kick()

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

    def _barrier(self) -> None:
        """Wait for every lane's items that this barrier waits for (D4, with lags); under
        :meth:`run_now`, for every item."""
        if not self.lagged or self._barrier_all:
            for lane in self.lagged:  # run_now: drop the lag marks that fall due, as always
                lane.barrier_target(self.counters.batches)
            targets = [(lane, lane.enq) for lane in self.lanes if lane.done < lane.enq]
        else:
            batches = self.counters.batches
            targets = []
            for lane in self.lanes:
                target = lane.enq if lane.uniform else lane.barrier_target(batches)
                if lane.done < target:
                    targets.append((lane, target))
        if targets:
            self._wait(targets, "barrier", self._event)

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
        self._kick()
        targets = [(lane, lane.enq) for lane in self.lanes if lane.done < lane.enq]
        if targets:
            self._wait(targets, "barrier")
        if records:
            logged = [
                (lane, lane.log_enq)
                for lane in self.destinations
                if lane.log_done < lane.log_enq and lane.state != CLAIMED
            ]
            if logged:
                self._wait(logged, "records")
        if self.gate.stopping:
            raise Stopped

    def wait_for_records(self, targets: list[tuple[Lane, int]], kind: Any) -> None:
        """Wait, on the training thread, for destinations to take records (D12)."""
        self._wait(targets, kind)

    def _wait(self, targets: list[tuple[Lane, int]], kind: Any, event: Event | None = None) -> None:
        self._kick()
        if self.inline.lanes:  # what the wait is for may sit unwoken in a lane
            self.inline.flush(run=False)
        if kind == "records" and self.inline.record_lanes:
            self.inline.flush_records()
        self.gate.wait(targets, kind, event)
