"""Lanes: each callback's queue of work for one run, and the gate the training thread waits at.

One :class:`Lane` per callback per session. Its items (one per published event it handles,
per logged record for a destination, per ``close`` call) run one at a time, in queue order
(D1), by the one runner its placement gives it (``members.py``, ``runners.py``):

- a thread lane's items go into its lane thread's FIFO (``pool.LaneThread``: a bounded
  pool of threads, each serving several callbacks in list order), which sleeps when it
  is empty until the producer wakes it (its rule: ``producer.py``);
- a loop lane's items go into its ``pending`` (a deque: an append, nothing woken); its
  task takes them from the left and, when there are none, sleeps on ``wakeup`` (woken
  through ``bridge.LoopWaker``).
- a loop lane's items from the training thread go into its ``inbox`` instead, which the
  training thread hands to the loop in one piece at each of its wake-ups of the loop
  (``Producer.hand_over``); the loop appends them to ``pending``, then ``WAKE_END``. At
  each ``WAKE_END`` the lane's task gives the loop a turn (it sleeps, or yields when more
  is queued), so a loop lane suspends once per wake-up that brought it work, however the
  threads interleave.

Counting: a :class:`Counts` per FIFO counts its event items, ``enq`` (the training thread)
and ``done`` (the runner): a loop lane's own, or its lane thread's, one for every callback
pinned there (their items run in one order, so one count says how far all of them got, and
a publish counts once per thread, not once per callback). ``Lane.log_enq``/``log_done``
count a destination's records. The training thread waits for these counts at the
:class:`Gate`: barriers (D4), full queues (D12), ``@blocking`` handlers (D9).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, MutableSequence, Sequence
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

from trainbus.bus.mailbox import Mailbox
from trainbus.core.exceptions import Stopped

if TYPE_CHECKING:
    import anyio

    from trainbus.bus.clock import BatchClock
    from trainbus.bus.members import Member, Slot
    from trainbus.bus.trace import TraceRecorder
    from trainbus.core.callback import Handler
    from trainbus.core.events import Event
    from trainbus.core.logger import Logger, LogRecord
    from trainbus.core.state import State

__all__ = [
    "STOP",
    "WAKE_END",
    "CallItem",
    "Counters",
    "Counts",
    "EventItem",
    "Gate",
    "Lane",
    "LogItem",
    "LoopEvent",
    "Stopped",
    "WaitKind",
    "WorkItem",
]

_perf = time.perf_counter

WaitKind = Literal["barrier", "fence", "backpressure", "records", "blocking"]


class LoopEvent(Protocol):
    """What a loop lane sleeps on: a one-shot event of the loop's library (made by
    ``bridge.LoopHandle.new_event``): ``set()`` and ``await event.wait()``, on the loop."""

    def set(self) -> None: ...

    def wait(self) -> Awaitable[Any]: ...


class LaneRunner(Protocol):
    """What a lane knows of its lane thread (``pool.LaneThread``, which imports this
    module): its FIFO and its counts, ``put``, the handlers a bare event item runs, whom it
    waits for."""

    pending: deque[Any]
    counts: Counts
    subs: dict[Event, list[tuple[Lane, Slot, Callable[..., Any], bool, bool]]]  # pool.Sub
    waiting_on: Lane | None

    def put(self, lane: Lane, item: WorkItem) -> None: ...


# -- work items ----------------------------------------------------------------------------


class EventItem:
    """One published event: the state as of its publication and a logger bound to it.

    One item is built per event and queued on every lane that handles the event (each
    lane finds its handler by ``event``). ``batch`` is the batch count at publication.
    """

    __slots__ = ("batch", "event", "logger", "view")

    def __init__(self, event: Event, view: State, logger: Logger, batch: int) -> None:
        self.event: Final = event
        self.view: Final = view
        self.logger: Final = logger
        self.batch: Final = batch


class LogItem:
    """One logged record, queued on every destination; without a record, the marker of a
    lossy destination's mailbox (its runner takes the records there, ``mailbox.py``)."""

    __slots__ = ("record",)

    def __init__(self, record: LogRecord | None) -> None:
        self.record: Final = record


class CallItem:
    """A call run in a lane's order (``close``, ``post_close``, a drain mark).

    ``fn()`` is called (and awaited if ``is_async``); then ``on_done(error)`` on the loop.
    A drain mark has no ``fn``: taking it only tells that everything before it ran.
    """

    __slots__ = ("fn", "is_async", "label", "on_done")

    def __init__(
        self,
        fn: Callable[[], Any] | None,
        is_async: bool,
        on_done: Callable[[BaseException | None], None],
        label: str = "",
    ) -> None:
        self.fn: Final = fn
        self.is_async: Final = is_async
        self.on_done: Final = on_done
        self.label: Final = label


class _StopItem:
    """The last item a lane's runner takes: it ends."""

    __slots__ = ()


STOP: Final = _StopItem()


class _WakeEndItem:
    """The end of what one wake-up of the loop brought a loop lane: its task gives the
    loop a turn here (see the module docstring)."""

    __slots__ = ()


WAKE_END: Final = _WakeEndItem()

WorkItem = EventItem | LogItem | CallItem | _StopItem | _WakeEndItem


# -- lanes ---------------------------------------------------------------------------------


class Lane:
    """One callback's queue and counters for one session (see the module docstring)."""

    __slots__ = (
        "abandoned",
        "count_lock",
        "counts",
        "current",
        "failed",
        "gate",
        "idle",
        "inbox",
        "index",
        "lock",
        "log_done",
        "log_enq",
        "log_limit",
        "log_slot",
        "mailbox",
        "member",
        "name",
        "on_thread",
        "owes",
        "pending",
        "room",
        "room_waiters",
        "room_wakers",
        "runner",
        "scope",
        "slots",
        "thread",
        "uniform",
        "wait_log",
        "waiting_on",
        "wakeup",
    )

    def __init__(self, member: Member, gate: Gate, queue_size: int = 128) -> None:
        self.member = member
        self.gate = gate
        self.name = member.name
        self.index = member.index
        self.slots = member.slots
        self.log_slot = member.log_slot
        self.on_thread = member.on_thread
        #: A loop lane's items, in order (its task takes them from the left). A thread
        #: lane's are in its lane thread's FIFO (``runner.pending``).
        self.pending: deque[WorkItem] = deque()
        #: Where the training thread queues a loop lane's items: a list that only the
        #: training thread touches until it hands it over (unused for a thread lane).
        self.inbox: MutableSequence[WorkItem] = []
        #: Whether a loop lane's task sleeps (or is about to): set before its second look
        #: at ``pending``, so an append either is seen or sees it sleep.
        self.idle = False
        #: Who runs the lane's items: its ``pool.LaneThread`` (set there) for a thread
        #: lane; the lane itself (its task) for a loop lane. Lanes with one runner run one
        #: item at a time between them (records' waits for room follow runners).
        self.runner: LaneRunner | Lane = self
        #: A thread lane's lane thread (``None`` for a loop lane).
        self.thread: LaneRunner | None = None
        #: A loop lane's task sleeps on ``wakeup`` (``bridge.LoopWaker`` sets it).
        self.wakeup: LoopEvent | None = None
        #: Held by whoever runs one of the lane's items: its thread, or the training thread
        #: running a plain ``@blocking`` handler (so the two never overlap, D1).
        self.lock = threading.Lock()
        self.count_lock = threading.Lock()
        #: Whether every slot has lag 0 (then a barrier waits for all its items).
        self.uniform = member.lags == frozenset({0})
        #: Who counts its event items: its own (a loop lane), else its lane thread's
        #: (``pool.LaneThread`` replaces it with the thread's).
        self.counts = Counts([self], gate)
        # ``log_enq`` changes under ``count_lock`` (records come from any thread);
        # ``log_done`` only on the runner.
        self.log_enq = 0
        self.log_done = 0
        policy = member.backpressure
        #: For a destination: records logged and not yet delivered at which it is behind
        #: (its ``backpressure`` limit, else ``queue_size``; D12, ``docs/loggers.md``).
        own = None if policy is None else policy.queue_size
        self.log_limit = queue_size if own is None else own
        #: For a destination with a lossy policy: where its records wait (``mailbox.py``);
        #: its FIFO then gets markers only. ``None`` for every other lane.
        self.mailbox = Mailbox(self, policy) if policy is not None and policy.lossy else None
        self.wait_log: int | None = None
        #: Threads other than the training thread wait here for room among records (D12).
        self.room = threading.Condition(threading.Lock())
        self.room_waiters = 0
        #: Called (any thread) as records are taken, while loop lanes wait for room here.
        self.room_wakers: list[Callable[[], None]] = []
        #: A loop lane whose handler logged past a destination's bound: that destination;
        #: the lane's task waits for room in it before its next item.
        self.owes: Lane | None = None
        #: The destination this lane waits for room in now (cycle checks).
        self.waiting_on: Lane | None = None
        #: The cancel scope of the coroutine handler running now, if any (D11).
        self.scope: anyio.CancelScope | None = None
        #: Set when the lane missed its close deadline: nobody waits for it any more.
        self.abandoned = False
        #: The handler running now (``"Class.method"``), for messages; else ``None``.
        self.current: str | None = None
        #: Set when one of its handlers raised: it runs nothing more but its close (D10).
        self.failed = False

    # -- counting records (the runner) -----------------------------------------------------

    def count_log_done(self, n: int = 1) -> None:
        """Count ``n`` delivered (or skipped) records; tell whoever waits for room."""
        self.log_done += n
        target = self.wait_log
        if target is not None and self.log_done >= target:
            self.gate.reached(self, self)
        if self.room_waiters:
            with self.room:
                self.room.notify_all()
        if self.room_wakers:
            for waker in tuple(self.room_wakers):
                waker()

    def count_record(self) -> int:
        """Count one queued record (any thread); return how many wait now."""
        with self.count_lock:
            self.log_enq += 1
            return self.log_enq - self.log_done

    def wait_for_room(self, bound: int, give_up: Callable[[], bool]) -> None:
        """Block this thread (not the training thread, not the loop) until fewer than
        ``bound`` records wait here, or ``give_up()`` (checked every 50 ms) says to stop."""
        with self.room:
            self.room_waiters += 1
            try:
                while self.log_enq - self.log_done >= bound and not give_up():
                    self.room.wait(0.05)
            finally:
                self.room_waiters -= 1


class Counts:
    """The event items of one FIFO: queued (``enq``, the training thread) and done (``done``,
    its runner), and what a barrier waits for of them (lags).

    A loop lane has its own; a lane thread has one for all the callbacks pinned to it
    (``pool.LaneThread``): their items run in the thread's one order, so ``done`` reaching
    ``n`` means its first ``n`` items are done, whoever's they were. So the training thread
    counts an event once per thread, a barrier waits for each thread once, and a pooled
    callback's queue (D12) is its thread's: at most ``queue_size`` items wait there.

    Attributes:
        lanes: The lanes whose items it counts.
        enq: Event items queued.
        done: Event items finished (or skipped), in queue order.
        wait_done: The ``done`` count the training thread waits for now, if it waits.
        uniform: Whether all its lanes' slots have lag 0 (a barrier waits for ``enq``).
        last_by_lag: Per lag: the ``enq`` count after its last item of that lag.
        last_fenced: With lags: ``enq`` after its last item not of a ``@trailing`` handler.
        due: Per lag > 0: ``(due batch, enq count)`` marks pushed at each ``BATCH_END``.
        last_batch: The batch of the last item done (lag statistics).
        peak: The most items queued at once.
        abandoned: Set when one of its lanes missed its close deadline: nobody waits for it.
    """

    __slots__ = ("abandoned", "done", "due", "enq", "gate", "lanes", "last_batch",
                 "last_by_lag", "last_fenced", "peak", "uniform", "wait_done")

    def __init__(self, lanes: Sequence[Lane], gate: Gate) -> None:
        self.lanes = list(lanes)
        self.gate = gate
        self.enq = 0
        self.done = 0
        self.wait_done: int | None = None
        lags = frozenset({0}).union(*(lane.member.lags for lane in self.lanes))
        self.uniform = lags == frozenset({0})
        self.last_by_lag = dict.fromkeys(lags, 0)
        self.last_fenced = 0
        self.due: dict[int, deque[tuple[int, int]]] = {k: deque() for k in lags if k}
        self.last_batch = 0
        self.peak = 0
        self.abandoned = False

    # -- lags (training thread; ``@trailing`` slots) --------------------------------------

    def mark_batch_end(self, batches: int) -> None:
        """Note, per lag k, the ``enq`` count a barrier must wait for k batches later."""
        for lag, marks in self.due.items():
            marks.append((batches + lag, self.last_by_lag[lag]))

    def barrier_target(self, batches: int) -> int:
        """The ``done`` count the barrier of batch ``batches`` waits for (lag-0 items, and
        each lagging slot's items whose k batches have passed)."""
        target = self.last_by_lag.get(0, 0)
        for marks in self.due.values():
            while marks and marks[0][0] <= batches:
                target = max(target, marks.popleft()[1])
        return target

    # -- counting (the runner) ------------------------------------------------------------

    def count_done(self, lane: Lane) -> None:
        """Count one skipped event item of ``lane``; tell the gate at its target (a finished
        one is counted by ``runners.account``, which writes this out). The peak is kept
        here, off the training thread: the depth is at its highest just before a count."""
        depth = self.enq - self.done
        if depth > self.peak:
            self.peak = depth
        self.done += 1
        target = self.wait_done
        if target is not None and self.done >= target:
            self.gate.reached(self, lane)

    def busy(self) -> list[Lane]:
        """Its lanes that run a handler now, else all of them (for messages)."""
        return [lane for lane in self.lanes if lane.current is not None] or self.lanes


def would_deadlock(waiter: LaneRunner | Lane | None, dest: Lane) -> bool:
    """Whether ``waiter`` (a lane thread, or a loop lane's task) waiting for room in
    ``dest`` could wait for ever: ``dest`` runs on ``waiter`` (a callback pinned to the
    same lane thread), or on a runner that waits, through a chain of runners waiting for
    room, for ``waiter``."""
    runner: LaneRunner | Lane | None = dest.runner
    hops = 0
    while runner is not None and hops < 64:
        if runner is waiter:
            return True
        nxt = runner.waiting_on
        runner = nxt.runner if nxt is not None else None
        hops += 1
    return hops >= 64


# -- counters and the gate ----------------------------------------------------------------


class Counters:
    """What the producer counts over the engine's lifetime (training thread writes).

    Attributes:
        published: Events published.
        batches: ``BATCH_END`` events published.
        barrier_waits: Waits at barriers (and for ``@blocking`` handlers' lanes).
        barrier_wait: Seconds spent in those.
        backpressure_wait: Seconds spent waiting for full queues (D12).
        loop_wakeups: Wake-ups of the event loop's dispatcher (loop thread writes).
        trace, clock: The timeline recorder, the batch clock (``bus/clock.py``), while kept.
    """

    __slots__ = ("backpressure_wait", "barrier_wait", "barrier_waits", "batches", "clock",
                 "loop_wakeups", "published", "trace")

    def __init__(self) -> None:
        self.published = 0
        self.batches = 0
        self.barrier_waits = 0
        self.barrier_wait = 0.0
        self.backpressure_wait = 0.0
        self.loop_wakeups = 0
        self.trace: TraceRecorder | None = None
        self.clock: BatchClock | None = None

    def waited(self, kind: str, start: float, elapsed: float) -> None:
        """Count one wait of the producer."""
        if kind in ("backpressure", "records"):
            self.backpressure_wait += elapsed
            kind = "backpressure"
        else:
            self.barrier_wait += elapsed
            self.barrier_waits += 1
            kind = "barrier"
        if self.trace is not None:
            self.trace.producer_wait(kind, start, elapsed)


class Gate:
    """What the training thread waits for, failures, and stopping, for one session.

    The training thread waits for event items (:meth:`wait`: a :class:`Counts` reaching a
    ``done`` count) or for records (:meth:`wait_records`: a destination's ``log_done``).

    Invariant: ``_waiting`` holds what the training thread waits for right now; it changes
    only under ``_lock``, and ``_signal`` gets one ``True`` when it empties (one signal per
    wait) or a ``False`` from :meth:`stop`.
    """

    def __init__(self, counters: Counters) -> None:
        self._lock = threading.Lock()
        self._signal: SimpleQueue[bool] = SimpleQueue()
        self._waiting: set[Counts | Lane] = set()
        self.counters = counters
        #: Set once; then the training thread unwinds at its next event or wait.
        self.stopping = False
        self.errors: list[BaseException] = []
        #: The lane whose item (or record) ended the current wait: the wait is its doing.
        self._last: Lane | None = None
        #: Seconds one wait may last before ``on_long_wait`` is told (once per wait).
        self.wait_warning = math.inf
        #: Told ``(kind, event, lanes, seconds)`` when a wait passes ``wait_warning``.
        self.on_long_wait: Callable[[WaitKind, Event | None, list[Lane], float], None] | None
        self.on_long_wait = None

    def wait(
        self, targets: list[tuple[Counts, int]], kind: WaitKind, event: Event | None = None
    ) -> None:
        """Block until each of ``targets`` has ``done`` its target count of event items.

        Raises:
            Stopped: The session is stopping.
        """
        with self._lock:
            for counts, target in targets:
                counts.wait_done = target
                if counts.done < target and not counts.abandoned:
                    self._waiting.add(counts)
        try:
            if self._waiting:
                self._block(kind, event)
        finally:
            with self._lock:
                for counts, _ in targets:
                    counts.wait_done = None
                self._waiting.clear()

    def wait_records(self, targets: list[tuple[Lane, int]], event: Event | None = None) -> None:
        """Block until each destination of ``targets`` has taken its target count of
        records (its ``log_done``).

        Raises:
            Stopped: The session is stopping.
        """
        with self._lock:
            for lane, target in targets:
                lane.wait_log = target
                if lane.log_done < target and not lane.abandoned:
                    self._waiting.add(lane)
        try:
            if self._waiting:
                self._block("records", event)
        finally:
            with self._lock:
                for lane, _ in targets:
                    lane.wait_log = None
                self._waiting.clear()

    def _block(self, kind: WaitKind, event: Event | None) -> None:
        t0 = _perf()
        after = self.wait_warning
        if after == math.inf or self.on_long_wait is None:
            self._signal.get()
        else:
            try:
                self._signal.get(timeout=after)
            except Empty:
                with self._lock:
                    lanes = self._waited_lanes()
                self.on_long_wait(kind, event, lanes, after)
                self._signal.get()
        elapsed = _perf() - t0
        self.counters.waited(kind, t0, elapsed)
        last, self._last = self._last, None
        if last is not None:
            last.member.wait_caused += elapsed
        if self.stopping:
            raise Stopped

    def _waited_lanes(self) -> list[Lane]:
        """The lanes the training thread waits for now, in list order (under ``_lock``):
        a destination's, or, for a lane thread, the callbacks running there now."""
        lanes: set[Lane] = set()
        for waited in self._waiting:
            if isinstance(waited, Counts):
                lanes.update(waited.busy())
            else:
                lanes.add(waited)
        return sorted(lanes, key=lambda lane: lane.index)

    def reached(self, waited: Counts | Lane, lane: Lane) -> None:
        """``waited`` reached what the training thread waits for, with an item or record of
        ``lane`` (any thread)."""
        with self._lock:
            if waited in self._waiting:
                self._waiting.discard(waited)
                if not self._waiting:
                    self._last = lane
                    self._signal.put(True)

    def fail(
        self,
        exc: BaseException,
        handler: Handler | None,
        event: Event | None,
        lane: Lane | None = None,
    ) -> None:
        """Record a handler's exception and stop the training thread at its next event.

        ``lane``, the failed handler's lane, runs nothing more but its close (D10).

        A :class:`Stopped` that reaches a handler while the session stops (it waited inside
        the handler, for a destination's room say, and the wait ended with the stop) is the
        bus unwinding it, not the handler's error: it is not recorded.
        """
        if isinstance(exc, Stopped) and self.stopping:
            return
        if lane is not None:
            lane.failed = True
        if handler is not None:
            _start_at_user_code(exc)
            where = f"Event.{event.name}" if event is not None else "a logged record"
            if handler.qualname.endswith(".background"):
                where = "its background task"
            exc.add_note(f"raised by {handler.qualname} while handling {where}")
        with self._lock:
            self.errors.append(exc)
        self.stop()

    def stop(self) -> None:
        """Stop the training thread at its next event or wait (any thread)."""
        self.stopping = True
        self._signal.put(False)


#: trainbus's own source folder: frames from here are the bus's, not the user's.
_OURS = str(Path(__file__).resolve().parents[1])


def _start_at_user_code(exc: BaseException) -> None:
    """Drop the bus's own frames from the start of a handler error's traceback, so that it
    starts at the user's handler (an error of the bus itself keeps its whole traceback)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_OURS):
        tb = tb.tb_next
    if tb is not None:
        exc.__traceback__ = tb
