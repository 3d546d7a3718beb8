"""Publishing: what the training thread does at each event (one event's whole path:
``bus/__init__.py``).

:meth:`Producer.publish` builds one item per event (a snapshot, D5) and goes down the
event's ``Producer.plan`` as Composer's ``_run_callbacks`` goes down its callbacks; at a
barrier it then waits at the gate (D4, with lags), at a full queue for room first (D12).
Nothing here depends on how long anything took.

The wake rule (never by time). Invariant: a worker that sleeps with items is woken

- before the training thread waits (every worker, ``Producer.wait``);
- on a thread: at the end of a publish with an event outside a batch's inside
  (``INSIDE_BATCH``);
- on the loop (one call into the loop for all its workers, ``Producer.hand_over``): at an
  event that ends a batch (``ENDS_BATCH``), at the end of a publish with an event outside
  the batch loop (``WAKES_LOOP``), and at the end of a batch's first publish that queues
  work for the loop, whatever its events. So a batch wakes the loop at most twice.

The live fence (``docs/concurrency.md``). Invariant: a publish that includes
``BEFORE_TRAIN_BATCH`` returns only once every handler of every event before the batch's
lead events (``FENCE_LEADS``) has finished, but a declared ``@trailing(k)`` one's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from time import perf_counter as _perf
from typing import TYPE_CHECKING, Any, Final

from trainbus.bus.members import due
from trainbus.bus.queue import EventItem, WorkQueue
from trainbus.bus.slow import SlowCallbacks
from trainbus.bus.worker import hand_over_on_loop, wake_chain
from trainbus.core.events import Event
from trainbus.core.exceptions import Stopped

if TYPE_CHECKING:
    from trainbus.bus.counters import Counters
    from trainbus.bus.members import Member, Slot
    from trainbus.bus.options import BusOptions
    from trainbus.bus.queue import Counted, Gate, WaitKind
    from trainbus.bus.worker import Lane, Worker
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["Plan", "Producer"]

#: What publishing an event does with its handlers (see ``Producer.plan``).
Plan = tuple[list["WorkQueue"], list[tuple["Lane", "Slot"]], list[tuple["Lane", "Slot"]]]

#: Events inside a batch, before its end: they wake no thread (a thread switch is the
#: dearest part of a plain call); what they queue runs at the batch's end or a wait.
INSIDE_BATCH: Final = frozenset({
    Event.AFTER_DATALOADER, Event.BATCH_START, Event.BEFORE_TRAIN_BATCH, Event.BEFORE_FORWARD,
    Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS, Event.BEFORE_BACKWARD,
    Event.AFTER_BACKWARD, Event.AFTER_TRAIN_BATCH, Event.EVAL_BATCH_START,
    Event.EVAL_BEFORE_FORWARD, Event.EVAL_AFTER_FORWARD,
})

#: The events that end a batch: the loop is handed what the batch queued for it there.
ENDS_BATCH: Final = frozenset({Event.BATCH_END, Event.EVAL_BATCH_END})

#: The events outside the batch loop: a publish with one hands the loop its work at its end
#: (what ``BATCH_CHECKPOINT`` queues rides the next batch's first hand-over).
WAKES_LOOP: Final = frozenset(set(Event) - INSIDE_BATCH - ENDS_BATCH - {Event.BATCH_CHECKPOINT})

#: A batch's lead events, before it first changes the gradients or weights: the live fence
#: does not wait for their handlers.
FENCE_LEADS: Final = frozenset(
    {Event.AFTER_DATALOADER, Event.BATCH_START, Event.BEFORE_TRAIN_BATCH}
)

#: The event after which the training thread zeroes the gradients (module constants: each
#: ``Event.X`` is a metaclass lookup).
_FENCE_AT: Final = Event.BEFORE_TRAIN_BATCH
_BATCH_END: Final = Event.BATCH_END


class Producer:
    """Publishing, barriers and backpressure for one session (training thread).

    Attributes:
        plan: Per event, its handlers in offering order (loggers first at ``INIT``, last
            otherwise, as Composer does), by what publishing does with them:
            ``(queues, here, others)``: the queues of the workers that only queue it (one
            item each, for all its callbacks there: the common case), the plain
            ``@blocking`` handlers (run here, after their callback's earlier items, D9),
            the rest (a filter, a lag, ``async def @blocking``: an item each, by its rules).
        ident: The thread that may publish now (the training thread, or a plain-code caller).
        running_here: The lane whose ``@blocking`` handler runs on this thread now.
    """

    def __init__(
        self,
        *,
        state: State,
        logger: Logger,
        members: Sequence[Member],
        lanes: Sequence[Lane],
        workers: Sequence[Worker],
        options: BusOptions,
        gate: Gate,
        counters: Counters,
        call_soon: Callable[..., Any],
        warn: Callable[[str, object], None],
    ) -> None:
        self.state = state
        self.logger = logger
        self.members = members
        self.barriers = options.barriers
        self.warn_slow = options.warn_slow
        self.gate = gate
        self.counters = counters
        self.call_soon = call_soon
        self.warn = warn
        self.destinations = [lane for lane in lanes if lane.log_slot is not None]
        self.queues: list[WorkQueue] = [worker.queue for worker in workers]
        self.lagged = [queue for queue in self.queues if not queue.uniform]
        self.threads = [worker for worker in workers if worker.on_thread]
        self.loop_workers = [worker for worker in workers if not worker.on_thread]
        self.plan: dict[Event, Plan] = {}
        #: The events that queue items on workers on the loop.
        self.to_loop: set[Event] = set()
        for event in Event:
            subs = [(lane, lane.slots[event]) for lane in lanes if event in lane.slots]
            if event is Event.INIT:
                subs.sort(key=lambda pair: pair[0].log_slot is None)
            if all(_only_queued(lane, slot) for lane, slot in subs):
                for lane, slot in subs:
                    lane.worker.subs.setdefault(event, []).append((lane, slot))
                queued = dict.fromkeys(lane.worker for lane, _ in subs)  # in order, once each
                self.plan[event] = ([worker.queue for worker in queued], [], [])
            elif all(slot.here and slot.when is None for _, slot in subs):
                self.plan[event] = ([], subs, [])
            else:
                self.plan[event] = ([], [], subs)
            if any(not lane.on_thread and not slot.here for lane, slot in subs):
                self.to_loop.add(event)
        #: The events inside a batch that no handler takes and no rule stops at (not the
        #: fence's event, not a barrier): publishing one only counts it.
        self.quiet = frozenset(
            event for event in INSIDE_BATCH - {_FENCE_AT} - self.barriers
            if self.plan[event] == ([], [], [])
        )
        self.ident: int | None = None
        self.running_here: Lane | None = None
        self.slow = SlowCallbacks()
        #: The last snapshot and its logger, and the frame and timestamp it was taken at.
        self._view: tuple[State, Logger] = (state, logger)
        self._view_frame: object = None
        self._view_ts: object = None
        self._trace_mark = 0.0
        #: While set, every event is published as a barrier that waits for every handler.
        self._barrier_all = False
        # The wake rule's state (module docstring). Invariant: ``_loop_owed`` is true iff a
        # worker on the loop holds items this thread queued since the last hand-over;
        # ``_woke_in_batch`` iff the loop was handed work since the batch began.
        self._loop_owed = False
        self._woke_in_batch = False
        # The live fence. Invariant: ``_fence_owed`` is true iff items the next fence must
        # wait for were queued since a barrier last waited for every item; ``_fence_marks``
        # holds the targets marked at the current batch's first lead item.
        self._fence_owed = False
        self._fence_marks: list[tuple[WorkQueue, int]] | None = None

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
        outside = to_loop_now = fence = False
        quiet = self.quiet
        for event in events:
            self.counters.published += 1
            if event in quiet and not self._barrier_all:
                continue
            workers, here, others = self.plan[event]
            if workers or here or others:
                item = self._item(event)
                if event in FENCE_LEADS:
                    if self._fence_owed:  # before the batch's first lead item
                        self._mark_fence()
                elif workers or others:
                    self._fence_owed = True
            if workers:  # D3: once per worker, for all its callbacks there
                full = WorkQueue.put_each(workers, item)
                while full is not None:  # D12: that queue is full: wait for room first
                    self.wait([(full, full.enq - full.bound + 1)], "backpressure", event)
                    rest = workers[workers.index(full):]
                    full = WorkQueue.put_each(rest, item)
            if here:
                self._run_here(here, item)
            for lane, slot in others:
                self._put_one(lane, slot, item)
            if event in self.to_loop:
                self._loop_owed = True
            if event in INSIDE_BATCH:
                fence = fence or event is _FENCE_AT
            else:
                outside = True
                if event in ENDS_BATCH:
                    if self._loop_owed:
                        self.hand_over()
                elif event in WAKES_LOOP:
                    to_loop_now = True
            if event is _BATCH_END:
                self._batch_end()
            if self._barrier_all or event in self.barriers:
                self._barrier(event)
                if event is _BATCH_END and self.counters.trace is not None:
                    self._trace_mark = _perf()  # the next batch's span starts after the wait
            if gate.stopping:
                raise Stopped
        if fence and (self._fence_owed or self._fence_marks is not None):
            self.fence()
        if self._loop_owed and (to_loop_now or not (outside or self._woke_in_batch)):
            self.hand_over()
        if outside:
            self._woke_in_batch = False  # the next batch's first publish may wake the loop
            self.wake_threads()

    def _put_one(self, lane: Lane, slot: Slot, item: EventItem) -> None:
        """Queue (or run) one handler of ``item`` by all its rules: filter, lag, ``@blocking``."""
        when = slot.when
        if when is not None and not due(slot, when, item.view.timestamp):
            return
        if slot.here:  # a plain @blocking handler: run it now, on this thread (D9)
            self._run_here(((lane, slot),), item)
            return
        queue = lane.worker.queue
        if queue.enq - queue.done >= queue.bound:  # D12: wait for room first
            self.wait([(queue, queue.enq - queue.bound + 1)], "backpressure", item.event)
        queue.put_event(
            EventItem(item.event, item.view, item.logger, item.batch, lane), slot.lag, slot.fenced
        )
        if slot.is_blocking:  # an async @blocking handler: wait for it (D9)
            self.wait([(queue, queue.enq)], "blocking", item.event)

    def fence(self) -> None:
        """Wait at the live fence (module docstring).

        Raises:
            Stopped: The session is stopping.
        """
        if self._fence_owed:  # queued after the marks (or no lead item marked them)
            self._mark_fence()
        marks, self._fence_marks = self._fence_marks, None
        if marks:
            targets = [(queue, target) for queue, target in marks if queue.done < target]
            if targets:
                self.wait(targets, "fence", _FENCE_AT)

    def _mark_fence(self) -> None:
        """Mark what the next fence waits for: every item so far but a ``@trailing`` handler's."""
        self._fence_owed = False
        self._fence_marks = [
            (queue, queue.enq if queue.uniform else queue.last_fenced) for queue in self.queues
        ]

    # -- waking ----------------------------------------------------------------------------

    def owe_loop(self) -> None:
        """This thread put a record in a loop worker's inbox: it rides the next hand-over."""
        self._loop_owed = True

    def hand_over(self) -> None:
        """Hand the loop its workers' inboxes and wake the sleeping ones, in one call into it."""
        self._loop_owed = False
        self._woke_in_batch = True
        waves = []
        for worker in self.loop_workers:
            queue = worker.queue
            inbox = queue.inbox
            if inbox:
                queue.inbox = []
                waves.append((worker, inbox))
        if waves:  # an inbox filtered to nothing (a handler not due) needs no wake-up
            try:
                self.call_soon(hand_over_on_loop, waves, self.counters)
            except Exception:  # the loop has ended (an abandoned thread came back late)
                return

    def wake_threads(self) -> None:
        """Start a wake-up down the chain of lane threads (``worker.wake_chain``)."""
        threads = self.threads
        if threads:
            threads[0].wakes[0] += 1  # before the look at the threads: see wake_chain
            wake_chain(threads)

    def wait(self, targets: Sequence[tuple[Counted, int]], kind: WaitKind,
             event: Event | None = None) -> None:
        """Wake every worker (the wake rule), then wait at the gate."""
        self.hand_over()
        self.wake_threads()
        self.gate.wait(targets, kind, event)

    # -- running here ----------------------------------------------------------------------

    def _item(self, event: Event) -> EventItem:
        """The event's item; its snapshot is shared while the state's frame and timestamp are
        the same objects (the training loop replaces one when a per-batch value changes)."""
        state = self.state
        frame, ts = state._frame, state._timer._ts
        if frame is not self._view_frame or ts is not self._view_ts:
            view = state.snapshot()
            self._view = (view, self.logger._bind(view))
            self._view_frame, self._view_ts = frame, ts
        view, logger = self._view
        return EventItem(event, view, logger, ts._batch)

    def _run_here(self, handlers: Sequence[tuple[Lane, Slot]], item: EventItem) -> None:
        """Run plain ``@blocking`` handlers on this thread, in order, each after its
        callback's earlier items and records, under its lock when it has a thread (D1, D9)."""
        event, trace = item.event, self.counters.trace
        for lane, slot in handlers:
            queue = lane.worker.queue
            locked = lane.on_thread or queue.done < queue.enq
            if locked:
                self._enter_here(lane, event)
            self.running_here = lane
            lane.current = slot.qualname
            t0 = _perf()
            try:
                slot.fn(item.view, item.logger)
            except BaseException as exc:  # every exception: the lock below is released
                lane.fail(exc, slot)
            elapsed = _perf() - t0
            if locked:
                lane.lock.release()
            lane.current = self.running_here = None
            slot.calls += 1  # ``worker.finished`` inlined (the hot path)
            slot.total_time += elapsed
            if elapsed > slot.max_time:
                slot.max_time = elapsed
            if trace is not None:
                trace.handler(lane.name, event, t0, elapsed)

    def _enter_here(self, lane: Lane, event: Event) -> None:
        """Wait for ``lane``'s earlier items and records, then take its lock (D1)."""
        queue, records = lane.worker.queue, lane.records
        if queue.done < queue.enq:
            self.wait([(queue, queue.enq)], "blocking", event)
        if records.done < records.enq:  # records logged before the event first (D1)
            self.wait([(records, records.enq)], "records", event)
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
        for queue in self.lagged:
            queue.mark_batch_end(batches)
        if self.slow.checking:  # a statistic, and a warning that cannot raise (D7)
            self.slow.at_batch_end(
                self.members, counters, self.warn if self.warn_slow else None
            )

    def _barrier(self, event: Event) -> None:
        """Wait for this barrier's targets (D4, with lags); under :meth:`run_now`, every item."""
        batches = self.counters.batches
        targets = []
        for queue in self.queues:
            if queue.uniform or self._barrier_all:
                target = queue.enq
                if not queue.uniform:
                    queue.barrier_target(batches)  # drops the marks that fall due
            else:
                target = queue.barrier_target(batches)
            if queue.done < target:
                targets.append((queue, target))
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
        targets = [(queue, queue.enq) for queue in self.queues if queue.done < queue.enq]
        if targets:
            self.wait(targets, "barrier")
        self._fence_owed = False
        self._fence_marks = None
        if records:
            own = self.running_here  # the @blocking handler's lane that asks, if any
            logged = [
                (lane.records, lane.records.enq)
                for lane in self.destinations
                if lane.records.done < lane.records.enq and lane is not own
            ]
            if logged:
                self.wait(logged, "records")
        if self.gate.stopping:
            raise Stopped


def _only_queued(lane: Lane, slot: Slot) -> bool:
    """Whether publishing only queues this handler (see ``Producer.plan``)."""
    return slot.when is None and not slot.is_blocking and lane.member.lags == frozenset({0})
