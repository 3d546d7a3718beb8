"""The event bus: the training thread publishes, lanes run handlers, barriers join them.

This module and :mod:`trainbus._lanes` are the only ones that know there are two
threads. ``publish`` runs on the producer (training) thread and never touches the event
loop except to wake it, at most once per burst. Everything that waits for the loop runs
in :meth:`EventBus.session`, on the loop.

See ``docs/concurrency.md`` for the model this implements (guarantees D1-D13).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any

import anyio

from trainbus._bridge import LoopHandle
from trainbus._callback import Handler, resolve_callback
from trainbus._dispatch import Dispatcher
from trainbus._events import Event
from trainbus._lanes import EVENT, LOG, Lane, Slot, finish_event
from trainbus._logger import Logger, LogRecord, resolve_log_handler
from trainbus._session import LoopSide, _NoEvent
from trainbus._slow import SlowCallbacks
from trainbus._statistics import BusStatistics, collect_statistics
from trainbus._stopped import Stopped

if TYPE_CHECKING:
    from trainbus._state import State
    from trainbus._trace import TraceRecorder

__all__ = ["EventBus", "Stopped"]

_perf = time.perf_counter
#: Seconds a cheap plain handler may wait, unwoken, for the next barrier (see ``_defer``).
_DEFER_MAX = 1e-3

#: Sync handlers measured at or under this many seconds run on the producer thread.
DEFAULT_INLINE_MAX = 50e-6
_EXTRA_METHODS = (("background", object, 2, "background(self, state, logger)"),)


class EventBus(LoopSide):
    """Carries events from one producer thread to the callbacks' lanes on the loop.

    Args:
        state: The live state; each publication captures a snapshot of it.
        logger: The root logger; its records are routed to destination lanes.
        callbacks: Callbacks, in the order they are offered events.
        barriers: Events after which the producer waits for every earlier handler.
        max_lag: Batches by which handlers may trail a ``BATCH_END`` barrier.
        queue_size: Event items that may wait per callback before the producer waits.
        inline_max: Seconds; plain handlers measured this fast run on the producer.
        warn_slow: Whether to emit :class:`SlowCallbackWarning`.
    """

    def __init__(
        self,
        state: State,
        logger: Logger,
        callbacks: Sequence[object],
        *,
        barriers: Iterable[Event] = (Event.BATCH_END,),
        max_lag: int = 0,
        queue_size: int = 128,
        inline_max: float = DEFAULT_INLINE_MAX,
        warn_slow: bool = True,
    ) -> None:
        self.state = state
        self.logger = logger
        self.barriers = frozenset(Event(e) for e in barriers)
        self.max_lag = max_lag
        self.queue_size = queue_size
        self.inline_max = inline_max
        self.warn_slow = warn_slow
        self.trace: TraceRecorder | None = None
        self.lanes: list[Lane] = []
        for i, cb in enumerate(callbacks):
            table = resolve_callback(cb, where=f"callbacks[{i}]", extra=_EXTRA_METHODS)
            self.lanes.append(Lane(table, i, resolve_log_handler(table)))
        self._destinations = [lane for lane in self.lanes if lane.is_destination]
        self._subs: dict[Event, list[tuple[Lane, Slot]]] = {}
        for event in Event:
            subs = [(lane, lane.slots[event]) for lane in self.lanes if event in lane.slots]
            if event is Event.INIT:  # loggers first at INIT, last otherwise (Composer)
                subs.sort(key=lambda pair: not pair[0].is_destination)
            self._subs[event] = subs
        self._lock = threading.Lock()
        self._signal: SimpleQueue[bool] = SimpleQueue()
        self._waiting: set[Lane] = set()
        self._dispatcher = Dispatcher(self)
        self._deferred: list[Lane] = []
        self._deferred_since = 0.0
        self._spawn_queue: deque[Callable[[], Any]] = deque()
        self._spawn_wakeup: anyio.Event | _NoEvent = _NoEvent()
        self._loop: LoopHandle | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._producer_ident: int | None = None
        self.stopping = False
        self.errors: list[BaseException] = []
        self._view_key: tuple[Any, Any] = (None, None)
        self._view: tuple[State, Logger] | None = None
        self._marks: deque[list[int]] = deque(maxlen=max_lag + 1)
        self._published = 0
        self._trace_mark = 0.0
        self._batches = 0
        self._barrier_wait = 0.0
        self._barrier_waits = 0
        self._backpressure_wait = 0.0
        self._peak_depth = 0
        self.slow = SlowCallbacks()

    # -- producer side ---------------------------------------------------------------------

    @property
    def loop(self) -> LoopHandle:
        """The loop of the running session."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("the bus has no running session")
        return loop

    def is_producer(self) -> bool:
        """Whether the calling thread is the session's producer thread."""
        return threading.get_ident() == self._producer_ident

    def publish(self, *events: Event) -> None:
        """Offer each event, in order, to every callback that handles it. Producer only.

        Returns once each handler is queued, or, for ``@blocking`` handlers and barrier
        events, once the handlers it must wait for have finished. Several events
        published together (nothing computed between them) share one snapshot of the
        state and wake each lane at most once.

        Raises:
            Stopped: The bus is stopping; the producer should unwind.
        """
        if self.stopping:
            raise Stopped
        if self._deferred and _perf() - self._deferred_since > _DEFER_MAX:
            self._flush_deferred(run=False)
        state = self.state
        subs_of = self._subs
        to_kick: list[Lane] = []
        try:  # a lane marked busy must be woken even when Stopped unwinds the burst
            for event in events:
                self._published += 1
                subs = subs_of[event]
                barrier = event in self.barriers
                if barrier and self._deferred:
                    self._kick(to_kick)
                    self._flush_deferred(run=True)
                if subs:
                    key = (state._frame, state._timer._ts)
                    view_key = self._view_key
                    if key[0] is not view_key[0] or key[1] is not view_key[1]:
                        view = state.snapshot()
                        self._view = (view, self.logger._bind(view))
                        self._view_key = key
                    view, logger = self._view  # type: ignore[misc]
                    inline: list[tuple[Lane, Slot]] | None = None
                    for lane, slot in subs:
                        when = slot.when
                        if when is not None and not self._due(slot, when, key[1]):
                            continue
                        if slot.inline_ok:
                            if not barrier:  # D3: queued, run at the barrier or on its thread
                                self._defer(lane, slot, view, logger, to_kick)
                                continue
                            if inline is None:
                                inline = []
                            inline.append((lane, slot))
                        elif slot.is_blocking:
                            self._kick(to_kick)
                            self._run_blocking(lane, slot, view, logger)
                        else:
                            self._enqueue(lane, slot, view, logger, to_kick)
                    if inline is not None:
                        self._run_inline_group(inline, view, logger, to_kick)
                if event is Event.BATCH_END:
                    self._batch_end()
                if barrier:
                    self._kick(to_kick)
                    self._barrier()
                if event is Event.BATCH_END:
                    self._trace_mark = _perf()
                if self.stopping:
                    raise Stopped
        finally:
            self._kick(to_kick)

    @staticmethod
    def _due(slot: Slot, when: Callable[[Any], bool], ts: Any) -> bool:
        """Whether a filtered handler runs for this event (``@once``: only the first time)."""
        if not when(ts):
            return False
        if getattr(when, "exact", False):
            slot.when = _never
        return True

    def _enqueue(
        self, lane: Lane, slot: Slot, view: State, logger: Logger, to_kick: list[Lane]
    ) -> None:
        depth = lane.enq - lane.done
        if depth >= self.queue_size:
            self._kick(to_kick)
            self._wait([(lane, lane.enq - self.queue_size + 1)], backpressure=True)
            depth = lane.enq - lane.done
        lane.pending.append((EVENT, slot, view, logger))
        lane.enq += 1
        if depth >= lane.peak:
            lane.peak = depth + 1
        if lane.idle:
            lane.idle = False
            to_kick.append(lane)

    def _defer(
        self, lane: Lane, slot: Slot, view: State, logger: Logger, to_kick: list[Lane]
    ) -> None:
        """Queue a cheap plain handler without waking its idle thread.

        Publishing never waits for a plain handler (D3). The handler runs when the training
        thread reaches the next barrier event (it waits there anyway, and runs the queued
        cheap handlers itself, saving a thread wake-up each), or on its thread if the lane is
        woken for another reason, or after ``_DEFER_MAX`` seconds.
        """
        if not lane.idle or lane.enq - lane.done >= self.queue_size:
            self._enqueue(lane, slot, view, logger, to_kick)
            return
        lane.pending.append((EVENT, slot, view, logger))
        lane.enq += 1
        if lane.enq - lane.done > lane.peak:
            lane.peak = lane.enq - lane.done
        if not lane.deferred:
            lane.deferred = True
            if not self._deferred:
                self._deferred_since = _perf()
            self._deferred.append(lane)

    def _flush_deferred(self, *, run: bool) -> None:
        """Run (at a barrier) or wake the lanes holding deferred handlers."""
        lanes, self._deferred = self._deferred, []
        slow = False
        for lane in lanes:
            lane.deferred = False
            if run and not slow and lane.idle and lane.exec_lock.acquire(False):
                slow = not self._run_deferred(lane)
            else:
                self._wake(lane)

    def _run_deferred(self, lane: Lane) -> bool:
        """Run an idle lane's queued cheap handlers here (its lock is held).

        Returns whether they all stayed cheap; a slow one is moved to its thread for good,
        and the rest of the lane is left to the thread.
        """
        lane.idle = False  # appenders must not wake the thread while this runs its items
        cheap = True
        pending = lane.pending
        try:
            while cheap and pending:
                item = pending[0]
                if item[0] != EVENT or not item[1].inline_ok:
                    break
                pending.popleft()
                _, slot, view, logger = item
                if self.stopping:
                    finish_event(self, lane, slot, view, 0.0, skipped=True)
                    continue
                t0 = _perf()
                try:
                    slot.fn(view, logger)
                except BaseException as exc:
                    self._fail(exc, slot.handler, slot.event)
                elapsed = _perf() - t0
                slot.inline_calls += 1
                if elapsed > self.inline_max:
                    slot.inline_ok = False
                    slot.inline_banned = True
                    cheap = False
                finish_event(self, lane, slot, view, elapsed)
        finally:
            lane.idle = True
            if pending:
                lane.idle = False
                lane.tokens.put(None)
            lane.exec_lock.release()
        return cheap

    def _run_inline_group(
        self, group: list[tuple[Lane, Slot]], view: State, logger: Logger, to_kick: list[Lane]
    ) -> None:
        """Run an event's cheap plain handlers on this thread, after queuing the others.

        The other lanes are woken first, so they run while these do (D2). A handler runs
        inline only while its lane is idle (D1); one that turns out slow is moved to its
        lane for good, and the handlers after it in this group are queued, not run here.
        """
        self._kick(to_kick)
        slow = False
        for lane, slot in group:
            if (
                not slow
                and slot.inline_ok
                and lane.enq == lane.done
                and not lane.pending
                and lane.exec_lock.acquire(False)
            ):
                # Read after the lane's counters: a handler that failed on the lane set
                # ``stopping`` before counting itself done. Then nothing more runs (D10).
                if not self.stopping:
                    slow = not self._run_inline(lane, slot, view, logger)
                    continue
                lane.exec_lock.release()
            self._enqueue(lane, slot, view, logger, to_kick)

    def _kick(self, lanes: list[Lane]) -> None:
        """Wake the lanes a burst of publications made busy (each was idle)."""
        if not lanes:
            return
        dispatcher = self._dispatcher
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

    def _run_inline(self, lane: Lane, slot: Slot, view: State, logger: Logger) -> bool:
        """Run a handler on this thread (its lock is held); return whether it stayed cheap."""
        t0 = _perf()
        try:
            slot.fn(view, logger)
        except BaseException as exc:
            self._fail(exc, slot.handler, slot.event)
        finally:
            lane.exec_lock.release()
        elapsed = _perf() - t0
        slot.account(elapsed)
        slot.inline_calls += 1
        lane.busy += elapsed
        cheap = elapsed <= self.inline_max
        if not cheap:
            slot.inline_ok = False
            slot.inline_banned = True
        if self.trace is not None:
            self.trace.handler(lane.name, slot.event, t0, elapsed)
        return cheap

    def _run_blocking(self, lane: Lane, slot: Slot, view: State, logger: Logger) -> None:
        """Run a ``@blocking`` handler before returning (D9), after the lane's backlog."""
        if slot.is_async:
            # Coroutines run on the loop: queue in order, then wait for this very item.
            lane.pending.append((EVENT, slot, view, logger))
            lane.enq += 1
            self._wake(lane)
            self._wait([(lane, lane.enq)], backpressure=False)
            return
        if lane.enq != lane.done:
            self._wait([(lane, lane.enq)], backpressure=False)
        if self.stopping:  # its lane skips what it had queued; so does this handler
            raise Stopped
        lane.exec_lock.acquire()
        self._run_inline(lane, slot, view, logger)

    def _batch_end(self) -> None:
        self._batches += 1
        if self.trace is not None:
            now = _perf()
            mark = self._trace_mark or self.trace.origin
            self.trace.producer_span(f"batch {self._batches}", mark, now - mark)
        if self.max_lag:
            self._marks.append([lane.enq for lane in self.lanes])
        if self.warn_slow and self.slow.checking:
            self.slow.at_batch_end(self)

    def _barrier(self) -> None:
        lanes = self.lanes
        if self.max_lag == 0:
            targets = [(lane, lane.enq) for lane in lanes if lane.done < lane.enq]
        elif len(self._marks) > self.max_lag:
            mark = self._marks[0]
            targets = [(lane, n) for lane, n in zip(lanes, mark, strict=True) if lane.done < n]
        else:
            return
        if targets:
            self._wait(targets, backpressure=False)

    def wait_all(self) -> None:
        """Block the producer until every handler published so far has finished."""
        targets = [(lane, lane.enq) for lane in self.lanes if lane.done < lane.enq]
        if targets:
            self._wait(targets, backpressure=False)
        if self.stopping:
            raise Stopped

    def _wait(
        self, targets: list[tuple[Lane, int]], *, backpressure: bool, logs: bool = False
    ) -> None:
        """Block the producer until each lane's ``done`` (or ``log_done``) reaches its target."""
        if self._deferred:  # what the wait is for may sit unwoken in a lane
            self._flush_deferred(run=False)
        with self._lock:
            for lane, target in targets:
                if logs:
                    lane.log_wait_target = target
                    behind = lane.log_done < target
                else:
                    lane.wait_target = target
                    behind = lane.done < target
                if behind:
                    self._waiting.add(lane)
                else:
                    lane.wait_target = lane.log_wait_target = None
            if not self._waiting:
                return
        t0 = _perf()
        self._signal.get()
        elapsed = _perf() - t0
        with self._lock:
            for lane, _ in targets:
                lane.wait_target = lane.log_wait_target = None
            self._waiting.clear()
        if backpressure:
            self._backpressure_wait += elapsed
        else:
            self._barrier_wait += elapsed
            self._barrier_waits += 1
        if self.trace is not None:
            self.trace.producer_wait("backpressure" if backpressure else "barrier", t0, elapsed)
        if self.stopping:
            raise Stopped

    def _reached(self, lane: Lane) -> None:
        """Called by a lane whose ``done`` reached its ``wait_target``."""
        with self._lock:
            if lane in self._waiting:
                self._waiting.discard(lane)
                if not self._waiting:
                    self._signal.put(True)

    # -- any thread --------------------------------------------------------------------------

    def _wake(self, lane: Lane) -> None:
        """Wake ``lane`` from any thread after appending to its queue."""
        if not lane.idle:
            return
        lane.idle = False
        if lane.on_thread:
            lane.tokens.put(None)
        else:
            self._dispatcher.schedule(lane)
            self._dispatcher.kick()

    def _fail(self, exc: BaseException, handler: Handler | None, event: Event | None) -> None:
        """Record a handler's exception and stop the producer at its next event."""
        if handler is not None:
            where = f"Event.{event.name}" if event is not None else "a logged record"
            exc.add_note(f"raised by {handler.qualname} while handling {where}")
        with self._lock:
            self.errors.append(exc)
        self.stop()

    def stop(self) -> None:
        """Stop the producer at its next event or wait. Safe from any thread."""
        self.stopping = True
        self._signal.put(False)

    def statistics(self) -> BusStatistics:
        """A snapshot of per-callback timings, queue depths, lag and producer waits."""
        return collect_statistics(self)

    def _submit_log(self, record: LogRecord) -> None:
        """Queue ``record`` on every destination's lane (any thread).

        Records the training thread logs are bounded by ``queue_size`` per destination
        (D12): a destination that falls that far behind makes the training thread wait.
        They are not part of barriers, which wait for event handlers only. Records logged
        from handlers never wait (that could block the loop); they are bounded by the
        handlers that log them.
        """
        producer = self.is_producer()
        for lane in self._destinations:
            if producer:
                if lane.log_enq - lane.log_done >= self.queue_size:
                    self._wait(
                        [(lane, lane.log_enq - self.queue_size + 1)], backpressure=True, logs=True
                    )
                lane.pending.append((LOG, record, True))
                lane.log_enq += 1
            else:
                lane.pending.append((LOG, record, False))
            self._wake(lane)


def _never(ts: Any) -> bool:
    """The filter of a ``@once`` handler that already ran."""
    return False
