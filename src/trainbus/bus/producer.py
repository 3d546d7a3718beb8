"""Publishing: what the training thread does when it publishes an event.

:meth:`Producer.publish` runs on the training thread. For each event it builds one item (a
snapshot of the state, D5) and, for every callback that handles the event, in list order:

- a plain ``@blocking`` handler runs right here, once its callback's earlier items are done
  (D9); an ``async def`` ``@blocking`` handler is queued and waited for;
- any other handler's item is counted (after waiting for room if its FIFO holds
  ``queue_size`` items, D12) and queued: on a loop lane's ``inbox`` (a list of its own),
  counted on the lane; on a lane thread (``pool.py``) once per thread, not per callback,
  counted on the thread, when every handler of the event is only queued (the common case),
  else as a ``(lane, item)`` pair, counted on the lane's thread too (``lanes.Counts``).
  Nothing is woken per item.

Waking, by rule (never by time), at the end of a publish: with an event outside a batch's
inside (``INSIDE_BATCH``), each sleeping lane thread with items (the first, which passes it
on down ``pool.WakeChain``). The loop, with one call
that hands it the loop lanes' inboxes (:meth:`Producer.hand_over`, ``bridge.LoopWaker``),
if something was queued for it since its last wake-up: at an event outside the batch loop
(``WAKES_LOOP``), at the batch's first publish that queues something for it (whatever its
events: the trainer's ``BEFORE_FORWARD``, a ``Bus.batch()``'s entry, a bridge's hook), and
at the batch's end (``ENDS_BATCH``; the barrier's wait hands over, else the publish does).
Before the training thread waits (a barrier, backpressure, a ``@blocking`` handler),
everything is woken and handed over.

At a barrier event it then waits at the gate for what the barrier waits for (D4, with each
lane's lag): for each FIFO's count (a loop lane's, a lane thread's), not for each callback.
Nothing here depends on how long anything took.

The live fence (D4's companion, ``docs/concurrency.md``): a publish that includes
``BEFORE_TRAIN_BATCH`` (after which the training thread zeroes the gradients) returns only
once every handler of every event before the batch's lead events (``FENCE_LEADS``) has
finished, but a declared ``@trailing(k)`` one's. So ``max_lag`` lets handlers trail the
``BATCH_END`` barrier across the next batch's data loading and lead events, never across its
compute. What the fence waits for is marked before the batch's first lead item is queued
(:meth:`Producer._mark_fence`); when a barrier waited for everything (every FIFO without
lags) and nothing was queued since but lead items, the fence has nothing to do and costs
one test.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from trainbus.bus.lanes import EventItem, Stopped
from trainbus.bus.members import due
from trainbus.bus.pool import WakeChain
from trainbus.bus.slow import SlowCallbacks
from trainbus.core.events import Event

if TYPE_CHECKING:
    from trainbus.bus.bridge import LoopWaker
    from trainbus.bus.lanes import Counters, Counts, Gate, Lane, LaneRunner, WaitKind
    from trainbus.bus.members import Member, Slot
    from trainbus.bus.options import BusOptions
    from trainbus.bus.pool import LaneThread
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["Plan", "Producer"]

#: What publishing an event does with its handlers (see ``Producer.plan``).
Plan = tuple[
    list["Lane"], list["LaneRunner"], list[tuple["Lane", "Slot"]], list[tuple["Lane", "Slot"]]
]

_perf = time.perf_counter

#: Events inside a batch, before its end. A thread lane is not woken for these: what they
#: queue on a callback's thread runs when the batch ends (``BATCH_END``, ``EVAL_BATCH_END``),
#: in one wake-up of the thread, or when the training thread waits, whichever is first. A
#: thread's wake-up is a thread switch (and a turn of the GIL), the dearest part of a plain
#: call. (The loop's rule is ``WAKES_LOOP``.)
INSIDE_BATCH: Final = frozenset({
    Event.AFTER_DATALOADER, Event.BATCH_START, Event.BEFORE_TRAIN_BATCH, Event.BEFORE_FORWARD,
    Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS, Event.BEFORE_BACKWARD,
    Event.AFTER_BACKWARD, Event.AFTER_TRAIN_BATCH, Event.EVAL_BATCH_START,
    Event.EVAL_BEFORE_FORWARD, Event.EVAL_AFTER_FORWARD,
})

#: The events whose publish wakes the loop, handing it everything queued for loop lanes
#: since its last wake-up: the events outside the batch loop (fit, epoch and eval start and
#: end, checkpoints of an epoch). Inside a batch (``INSIDE_BATCH``) the loop is woken once,
#: at the batch's first publish that queues something for it, whatever the event (the
#: trainer's lead events or its ``BEFORE_FORWARD``, a ``Bus.batch()``'s entry, a bridge's
#: first hook), and once at its end (``ENDS_BATCH``: the barrier's wait hands over; a
#: publish whose barrier waited for nothing hands over at its end). So a batch wakes the
#: loop at most twice however the loop that publishes is written, and what a batch's
#: ``BATCH_END`` queues (a trailing upload) is handed over when its batch ends, not when
#: the training thread next waits. What ``BATCH_CHECKPOINT`` queues after the barrier's
#: wait is handed over with the next batch's first wake-up. Each wake-up costs every loop
#: lane with work one suspension of its task (a resume through asyncio's ``call_soon``:
#: about 13,000 instructions, 1,100 a call with 10 callbacks on 12 events a batch).
WAKES_LOOP: Final = frozenset(
    set(Event) - INSIDE_BATCH - {Event.BATCH_END, Event.BATCH_CHECKPOINT, Event.EVAL_BATCH_END}
)

#: A batch's lead events, published before the training thread first changes the model's
#: gradients or weights in it: the live fence (``Producer.fence``) does not wait for their
#: handlers (they may run beside the batch's compute), only for every earlier event's.
FENCE_LEADS: Final = frozenset(
    {Event.AFTER_DATALOADER, Event.BATCH_START, Event.BEFORE_TRAIN_BATCH}
)

#: The event after which the training thread zeroes the gradients: a publish that includes it
#: ends at the live fence. (A module constant: ``Event.X`` costs a metaclass lookup per use.)
_FENCE_AT: Final = Event.BEFORE_TRAIN_BATCH

#: The events that end a batch: the loop is handed what the batch queued for it by the
#: barrier's wait, or, if that waited for nothing, at the end of the publish.
ENDS_BATCH: Final = frozenset({Event.BATCH_END, Event.EVAL_BATCH_END})


class Producer:
    """Publishing, barriers and backpressure for one session (training thread)."""

    def __init__(
        self,
        *,
        state: State,
        logger: Logger,
        members: Sequence[Member],
        lanes: Sequence[Lane],
        threads: Sequence[LaneThread],
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
        #: Every FIFO's counts, once each (a loop lane's, a lane thread's), in list order.
        self.counts: list[Counts] = list(dict.fromkeys(lane.counts for lane in lanes))
        self.lagged = [counts for counts in self.counts if not counts.uniform]
        #: Per event, its handlers in offering order (loggers first at INIT, last
        #: otherwise, as Composer does), by what publishing does with them. When it only
        #: queues each handler (no filter, not ``@blocking``, no lag: the common case):
        #: ``queued`` loop lanes (an enq count and an append to the inbox each) and the lane
        #: ``threads`` that get the event's item once each (an enq count and an append; their
        #: ``subs`` list its handlers there, in the same order). When it only runs each on
        #: this thread (plain ``@blocking``, no filter): ``here``. Else ``others``, every
        #: handler with the full rules.
        self.plan: dict[Event, Plan] = {}
        for event in Event:
            subs = [(lane, lane.slots[event]) for lane in lanes if event in lane.slots]
            if event is Event.INIT:
                subs.sort(key=lambda pair: pair[0].log_slot is None)
            if all(_only_queued(lane, slot) for lane, slot in subs):
                lane_threads: list[LaneRunner] = []
                for lane, slot in subs:
                    thread = lane.thread
                    if thread is not None:
                        if thread not in lane_threads:
                            lane_threads.append(thread)
                        sub = (lane, slot, slot.fn, slot.is_async, lane.member.shares_thread)
                        thread.subs.setdefault(event, []).append(sub)
                self.plan[event] = (
                    [lane for lane, _ in subs if lane.thread is None], lane_threads, [], [],
                )
            elif all(slot.here and slot.when is None for _, slot in subs):
                self.plan[event] = ([], [], subs, [])
            else:
                self.plan[event] = ([], [], [], subs)
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
        self.chain = WakeChain(threads)
        self.loop_lanes = [lane for lane in lanes if not lane.on_thread]
        #: Whether items were queued on loop lanes since the loop was last woken.
        self._loop_owed = False
        #: Hand-overs so far (a batch's end hands over if its barrier did not).
        self.hand_overs = 0
        #: Whether the loop was woken since the current batch began (its one wake-up
        #: inside a batch, see ``WAKES_LOOP``); cleared by a batch's end and by a publish
        #: of events outside a batch's inside.
        self._woke_inside = False
        #: The events that queue items on loop lanes (see ``WAKES_LOOP``).
        self.to_loop = frozenset(
            event
            for event, (queued, _, _, others) in self.plan.items()
            if any(not lane.on_thread for lane in queued)
            or any(not lane.on_thread and not slot.here for lane, slot in others)
        )
        #: The live fence: whether items were queued, since a barrier last waited for
        #: every item, that the next fence must wait for (events other than
        #: ``FENCE_LEADS``); and the targets marked at the current batch's first lead item.
        self._fence_owed = False
        self._fence_marks: list[tuple[Counts, int]] | None = None

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
        threads = loop = inside = fence = False
        ended: int | None = None  # hand-overs when the batch's end was published
        for event in events:
            self.counters.published += 1
            queued, threads_of, here, others = self.plan[event]
            if queued or threads_of or here or others:
                item = self._item(event)
                if event in FENCE_LEADS:
                    if self._fence_owed:  # before the batch's first lead item
                        self._mark_fence()
                elif queued or threads_of or others:
                    self._fence_owed = True
            for lane in queued:  # D3: an enq count and an append; woken below
                counts = lane.counts
                if counts.enq - counts.done >= queue_size:  # D12: wait for room first
                    self.wait([(counts, counts.enq - queue_size + 1)], "backpressure", event)
                counts.enq += 1  # before the item: its runner never counts past enq
                lane.inbox.append(item)
            for thread in threads_of:  # D3: once per lane thread, for all its callbacks
                counts = thread.counts
                if counts.enq - counts.done >= queue_size:  # D12: wait for room first
                    self.wait([(counts, counts.enq - queue_size + 1)], "backpressure", event)
                counts.enq += 1
                if not counts.uniform:  # a lag-0 item of a thread with trailing callbacks
                    counts.last_by_lag[0] = counts.enq
                    counts.last_fenced = counts.enq
                thread.pending.append(item)
            if here:
                self._run_here(here, item)
            for lane, slot in others:
                when = slot.when
                if when is not None and not due(slot, when, item.view.timestamp):
                    continue
                if slot.here:  # a plain @blocking handler: run it now, on this thread (D9)
                    self._run_here(((lane, slot),), item)
                    continue
                counts = lane.counts
                if counts.enq - counts.done >= queue_size:  # D12: wait for room first
                    self.wait([(counts, counts.enq - queue_size + 1)], "backpressure", event)
                counts.enq += 1  # before the item: its runner never counts past enq
                if not counts.uniform:
                    counts.last_by_lag[slot.lag] = counts.enq
                    if slot.fenced:
                        counts.last_fenced = counts.enq
                if lane.thread is not None:
                    lane.thread.pending.append((lane, item))
                else:
                    lane.inbox.append(item)
                if slot.is_blocking:  # an async @blocking handler: wait for it (D9)
                    self.wait([(counts, counts.enq)], "blocking", event)
            if event in self.to_loop:
                self._loop_owed = True
            if event in INSIDE_BATCH:
                inside = True
                if event is _FENCE_AT:
                    fence = True
            else:
                threads = True
                if event in WAKES_LOOP:
                    loop = True
                elif event in ENDS_BATCH:
                    ended = self.hand_overs
            if event is Event.BATCH_END:
                self._batch_end()
            if self._barrier_all or event in self.barriers:
                self._barrier(event)
                if event is Event.BATCH_END and self.counters.trace is not None:
                    self._trace_mark = _perf()  # the next batch's span starts after the wait
            if gate.stopping:
                raise Stopped
        if fence and (self._fence_owed or self._fence_marks is not None):
            self.fence()
        if self._loop_owed and (  # not owed after a wait, which handed everything over
            loop or ended == self.hand_overs or (inside and not self._woke_inside)
        ):
            self.hand_over()
        if ended is not None or not inside:
            self._woke_inside = False  # the next batch's first publish may wake it
        if threads:
            self.wake_threads()

    def fence(self) -> None:
        """The live fence: wait until every handler of every event published before the
        current batch's lead events (``FENCE_LEADS``) has finished, but a declared
        ``@trailing(k)`` one's (training thread; ``publish`` calls it after
        ``BEFORE_TRAIN_BATCH``, before the gradients are zeroed).

        Raises:
            Stopped: The session is stopping.
        """
        if self._fence_owed:  # queued after the marks (or no lead item marked them)
            self._mark_fence()
        marks, self._fence_marks = self._fence_marks, None
        if marks:
            targets = [(counts, target) for counts, target in marks if counts.done < target]
            if targets:
                self.wait(targets, "fence", Event.BEFORE_TRAIN_BATCH)

    def _mark_fence(self) -> None:
        """Mark what the next fence waits for: each FIFO's items queued so far, but a
        declared ``@trailing`` handler's."""
        self._fence_owed = False
        self._fence_marks = [  # every item so far, but a declared @trailing handler's
            (counts, counts.enq if counts.uniform else counts.last_fenced)
            for counts in self.counts
        ]

    def owe_loop(self) -> None:
        """Note that a loop lane's inbox holds a record (publishing thread): it rides the
        loop's next wake-up, as an event's item would."""
        self._loop_owed = True

    def hand_over(self) -> None:
        """Hand the loop lanes' inboxes to the loop, in one call into it that also wakes
        its sleeping lanes with work (publishing thread)."""
        if not self.loop_lanes:
            return
        waves = []
        for lane in self.loop_lanes:
            inbox = lane.inbox
            if inbox:
                lane.inbox = []
                waves.append((lane, inbox))
        self._loop_owed = False
        self.hand_overs += 1
        self._woke_inside = True
        if waves:  # an inbox filtered to nothing (a handler not due) needs no wake-up
            self.waker.deliver(waves)

    def wake_threads(self) -> None:
        """Wake the sleeping lane threads that have items (see ``INSIDE_BATCH``): one
        wake-up hands a thread everything queued for its callbacks since its last. The
        training thread wakes only the first; each passes the wake-up on to the next as it
        wakes (``pool.WakeChain``)."""
        if self.chain.threads:  # a session of loop lanes only never enters pool.py
            self.chain.start()

    def wait(
        self, targets: list[tuple[Counts, int]], kind: WaitKind, event: Event | None = None
    ) -> None:
        """Wake the lanes, then wait at the gate for event items (the training thread never
        waits for a lane it has not woken)."""
        self.hand_over()
        self.wake_threads()
        self.gate.wait(targets, kind, event)

    def wait_records(self, targets: list[tuple[Lane, int]], event: Event | None = None) -> None:
        """Wake the lanes, then wait at the gate for destinations to take records."""
        self.hand_over()
        self.wake_threads()
        self.gate.wait_records(targets, event)

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

    def _run_here(self, handlers: Sequence[tuple[Lane, Slot]], item: EventItem) -> None:
        """Run plain ``@blocking`` handlers on this thread, in order, each after its lane's
        backlog (D9).

        A callback with a thread of its own may run something there now (a record): the
        handler then waits for the lane's earlier items and runs under the lane's lock
        (D1). A callback without a thread runs nothing unless it has queued items.

        The call's statistics are ``runners.account``'s, written out: a call of it here
        measured 700 of a ``@blocking`` call's 4,138 instructions (callgrind, 10 callbacks),
        the difference between staying above Ignite's inline handler call and not. A call
        here is nobody's queued item, so there is no count for the gate.
        """
        event, trace = item.event, self.counters.trace
        for lane, slot in handlers:
            counts = lane.counts
            locked = lane.on_thread or counts.done < counts.enq
            if locked:
                self._enter_here(lane, event)
            self.running_here = lane
            lane.current = slot.qualname
            t0 = _perf()
            try:
                slot.fn(item.view, item.logger)
            except BaseException as exc:  # every exception: the lock below is released
                self.gate.fail(exc, slot.handler, event, lane)
            elapsed = _perf() - t0
            if locked:
                lane.lock.release()
            lane.current = self.running_here = None
            slot.calls += 1
            slot.total_time += elapsed
            if elapsed > slot.max_time:
                slot.max_time = elapsed
            if trace is not None:
                trace.handler(lane.name, event, t0, elapsed)

    def _enter_here(self, lane: Lane, event: Event) -> None:
        """Wait for ``lane``'s earlier items (on a pool thread: the thread's, which run in
        one order with them) and records, then take its lock (D1)."""
        counts = lane.counts
        if counts.done < counts.enq:
            self.wait([(counts, counts.enq)], "blocking", event)
        if lane.log_done < lane.log_enq:  # records logged before the event first (D1)
            self.wait_records([(lane, lane.log_enq)], event)
        if self.gate.stopping:
            raise Stopped
        lane.lock.acquire()

    # -- barriers --------------------------------------------------------------------------

    def _batch_end(self) -> None:
        counters = self.counters
        counters.batches += 1
        batches = counters.batches
        clock = counters.clock
        if clock is not None:
            clock.tick(_perf())
        trace = counters.trace
        if trace is not None:
            now = _perf()
            mark = self._trace_mark or trace.origin
            trace.producer_span(f"batch {batches}", mark, now - mark)
        for counts in self.lagged:
            counts.mark_batch_end(batches)
        if self.slow.checking:  # a statistic, and a warning that cannot raise (D7)
            self.slow.at_batch_end(
                self.members, counters, self.warn if self.warn_slow else None
            )

    def _barrier(self, event: Event) -> None:
        """Wait for what this barrier waits for (D4, with lags); under :meth:`run_now`, for
        every item."""
        batches = self.counters.batches
        targets = []
        for counts in self.counts:
            if counts.uniform:
                target = counts.enq
            else:
                target = counts.barrier_target(batches)  # drops the marks that fall due
                if self._barrier_all:
                    target = counts.enq
            if counts.done < target:
                targets.append((counts, target))
        if targets:
            self.wait(targets, "barrier", event)
        if self._barrier_all or not self.lagged:  # it waited for every item: none owed
            self._fence_owed = False
            self._fence_marks = None

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
        targets = [(counts, counts.enq) for counts in self.counts if counts.done < counts.enq]
        if targets:
            self.wait(targets, "barrier")
        self._fence_owed = False
        self._fence_marks = None
        if records:
            own = self.running_here  # the @blocking handler's lane that asks, if any
            logged = [
                (lane, lane.log_enq)
                for lane in self.destinations
                if lane.log_done < lane.log_enq and lane is not own
            ]
            if logged:
                self.wait_records(logged)
        if self.gate.stopping:
            raise Stopped


def _only_queued(lane: Lane, slot: Slot) -> bool:
    """Whether publishing only queues this handler (see ``Producer.plan``)."""
    return slot.when is None and not slot.is_blocking and lane.uniform
