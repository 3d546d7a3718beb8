"""The items a worker runs, the one bounded, counted queue type, and the gate.

A :class:`Counted` queue counts what is put on it and what its worker finished, and tells
the :class:`Gate` when the second reaches the target the training thread waits for there
(a barrier, D4; a full queue, D12; a ``@blocking`` handler's turn, D9; a destination's
records). A :class:`WorkQueue` holds one worker's items, counted once per worker however
many callbacks it runs; a :class:`RecordCounts` counts one destination's records.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, MutableSequence, Sequence
from pathlib import Path
from queue import Empty, SimpleQueue
from time import perf_counter as _perf
from typing import TYPE_CHECKING, Any, Final, Literal

from trainbus.core.exceptions import Stopped

if TYPE_CHECKING:
    from trainbus.bus.counters import Counters
    from trainbus.bus.members import Member
    from trainbus.core.callback import Handler
    from trainbus.core.events import Event
    from trainbus.core.logger import Logger, LogRecord
    from trainbus.core.state import State

__all__ = [
    "STOP",
    "WAKE_END",
    "CallItem",
    "Counted",
    "EventItem",
    "Gate",
    "LogItem",
    "RecordCounts",
    "WaitKind",
    "WorkItem",
    "WorkQueue",
]

WaitKind = Literal["barrier", "fence", "backpressure", "records", "blocking"]


# -- the items -----------------------------------------------------------------------------


class EventItem:
    """One published event: the state as of its publication and a logger bound to it.

    ``lane`` (a ``worker.Lane``, ``Any`` below ``worker.py``): the one a filtered, lagging or
    ``@blocking`` handler's item is for, else ``None``; ``batch``: the batch at publication.
    """

    __slots__ = ("batch", "event", "lane", "logger", "view")

    def __init__(self, event: Event, view: State, logger: Logger, batch: int,
                 lane: Any = None) -> None:
        self.event: Final = event
        self.view: Final = view
        self.logger: Final = logger
        self.batch: Final = batch
        self.lane: Final = lane


class LogItem:
    """One logged record for the destination ``lane``; without a record, the marker of a
    lossy destination's mailbox (the worker takes the records there, ``mailbox.py``)."""

    __slots__ = ("lane", "record")

    def __init__(self, record: LogRecord | None, lane: Any) -> None:
        self.record: Final = record
        self.lane: Final = lane


class CallItem:
    """A call run in ``lane``'s order (``close``, ``post_close``; a drain mark has no ``fn``):
    ``fn()``, awaited if ``is_async``, then ``on_done(error)`` on the loop."""

    __slots__ = ("fn", "is_async", "label", "lane", "on_done")

    def __init__(self, fn: Callable[[], Any] | None, is_async: bool,
                 on_done: Callable[[BaseException | None], None], lane: Any,
                 label: str = "") -> None:
        self.fn: Final = fn
        self.is_async: Final = is_async
        self.on_done: Final = on_done
        self.lane: Final = lane
        self.label: Final = label


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: The last item a worker takes: it ends.
STOP: Final = _Marker("STOP")
#: The end of what one hand-over brought a worker on the loop: it gives the loop a turn.
WAKE_END: Final = _Marker("WAKE_END")

WorkItem = EventItem | LogItem | CallItem | _Marker

#: Told ``(queue, by)`` when ``done`` reaches ``wait_done`` (:meth:`Gate.reached`).
Reached = Callable[["Counted", "Member | None"], None]


# -- the queues ----------------------------------------------------------------------------


class Counted:
    """A bounded count of queued work (module docstring).

    Attributes:
        enq: Put so far. Invariant: incremented before its item is appended (``done <= enq``).
        done: Finished (or skipped), in queue order. Invariant: written by the worker only.
        bound: How many may wait before whoever puts waits for room (D12).
        wait_done: The ``done`` the training thread waits for now, else ``None``.
            Invariant: set and cleared under the gate's lock.
        abandoned: Its worker missed a close deadline: nobody waits for it any more.
    """

    __slots__ = ("abandoned", "bound", "done", "enq", "reached", "wait_done")

    def __init__(self, reached: Reached, bound: int) -> None:
        self.reached = reached
        self.bound = bound
        self.enq = 0
        self.done = 0
        self.wait_done: int | None = None
        self.abandoned = False

    def _count_done(self, n: int, by: Member | None) -> None:
        self.done = done = self.done + n
        target = self.wait_done  # read once: the gate may clear it meanwhile
        if target is not None and done >= target:
            self.reached(self, by)


class WorkQueue(Counted):
    """One worker's items, in order; ``enq`` counts event items (the publishing thread).

    Attributes:
        items: The items; only the worker takes them.
        inbox: Where the publishing thread appends. Invariant: ``items`` itself for a
            worker on a thread; for one on the loop, a list only the publishing thread
            touches until ``Producer.hand_over`` gives it to the loop (the wake rule).
        uniform: Whether every handler queued here has lag 0 (a barrier waits for ``enq``).
        last_by_lag: Per lag: ``enq`` after its last item of that lag (training thread).
        last_fenced: ``enq`` after its last item not of a ``@trailing`` handler.
        due: Per lag > 0: ``(due batch, enq)`` marks pushed at each ``BATCH_END``.
        last_batch, peak: The batch of the last item done; the most items queued at once
            (both the worker's, for the statistics).
    """

    __slots__ = ("due", "inbox", "items", "last_batch", "last_by_lag", "last_fenced", "peak",
                 "uniform")

    def __init__(self, reached: Reached, bound: int, lags: frozenset[int] = frozenset({0})) -> None:
        super().__init__(reached, bound)
        self.items: deque[WorkItem] = deque()
        self.inbox: MutableSequence[WorkItem] = self.items
        lags = lags | {0}
        self.uniform = lags == {0}
        self.last_by_lag = dict.fromkeys(lags, 0)
        self.last_fenced = 0
        self.due: dict[int, deque[tuple[int, int]]] = {k: deque() for k in lags if k}
        self.last_batch = 0
        self.peak = 0

    def put_event(self, item: EventItem, lag: int, fenced: bool) -> None:
        """Count and append an event item of a handler with ``lag`` (training thread)."""
        self.enq = enq = self.enq + 1  # before the item: the worker never counts past enq
        if not self.uniform:
            self.last_by_lag[lag] = enq
            if fenced:
                self.last_fenced = enq
        self.inbox.append(item)

    @staticmethod
    def put_each(queues: Sequence[WorkQueue], item: EventItem) -> WorkQueue | None:
        """Put ``item`` on each of ``queues`` with lag 0 (the training thread's hot path), up
        to the first full one: return that queue (``item`` is on none from it on, the caller
        waits for room and calls again from it), or ``None`` when all took it."""
        for queue in queues:
            enq = queue.enq
            if enq - queue.done >= queue.bound:
                return queue
            queue.enq = enq = enq + 1  # before the item: the worker never counts past enq
            if not queue.uniform:
                queue.last_by_lag[0] = queue.last_fenced = enq
            queue.inbox.append(item)
        return None

    def count_done(self, batch: int, by: Member | None) -> None:
        """Count one event item done (the worker; ``by`` ran its last handler)."""
        self.last_batch = batch
        depth = self.enq - self.done  # the queue at its deepest since the last count
        if depth > self.peak:
            self.peak = depth
        self._count_done(1, by)

    # -- lags (training thread; ``@trailing`` handlers) -----------------------------------

    def mark_batch_end(self, batches: int) -> None:
        """Note, per lag k, the ``enq`` count a barrier must wait for k batches later."""
        for lag, marks in self.due.items():
            marks.append((batches + lag, self.last_by_lag[lag]))

    def barrier_target(self, batches: int) -> int:
        """The ``done`` count the barrier of batch ``batches`` waits for (lag-0 items, and
        each lagging handler's items whose k batches have passed)."""
        target = self.last_by_lag[0]
        for marks in self.due.values():
            while marks and marks[0][0] <= batches:
                target = max(target, marks.popleft()[1])
        return target


class RecordCounts(Counted):
    """A destination's records: logged (``enq``, any thread, under ``lock``) and taken
    (``done``, its worker), ``bound``: its ``backpressure`` limit, else ``queue_size``.

    Attributes:
        who: The destination (whose records end a wait: ``Member.wait_caused``).
        room_wakers: Called (any thread) as records are taken, for whoever waits for room.
    """

    __slots__ = ("lock", "room_wakers", "who")

    def __init__(self, reached: Reached, bound: int, who: Member) -> None:
        super().__init__(reached, bound)
        self.who = who
        self.lock = threading.Lock()
        self.room_wakers: list[Callable[[], None]] = []

    def count(self) -> int:
        """Count one logged record (any thread); return how many wait now."""
        with self.lock:
            self.enq += 1
            return self.enq - self.done

    def count_done(self, n: int = 1) -> None:
        """Count ``n`` records taken (the worker); tell whoever waits for room."""
        self._count_done(n, self.who)
        for waker in tuple(self.room_wakers):
            waker()

    def wait_for_room(self, give_up: Callable[[], bool]) -> None:
        """Block this thread (a lane thread, never the training thread or the loop) until
        fewer than ``bound`` records wait, or ``give_up()`` (checked every 50 ms) says so."""
        room = threading.Event()
        self.room_wakers.append(room.set)
        try:
            while self.enq - self.done >= self.bound and not give_up():
                room.wait(0.05)
                room.clear()  # after the wait, before the look: a later take sets it again
        finally:
            self.room_wakers.remove(room.set)


# -- where the training thread waits ---------------------------------------------------------


class Gate:
    """What the training thread waits for, failures, and stopping, for one session.
    Invariant: ``_waiting`` (what the training thread waits for now) changes only under
    ``_lock``; ``_signal`` gets one ``True`` a wait, as it empties, or a ``False`` (:meth:`stop`).
    """

    def __init__(self, counters: Counters) -> None:
        self._lock = threading.Lock()
        self._signal: SimpleQueue[bool] = SimpleQueue()
        self._waiting: set[Counted] = set()
        self.counters = counters
        self.stopping = False  #: set once; the training thread unwinds at its next event or wait
        self.errors: list[BaseException] = []
        self._last: Member | None = None  # whose item (or record) ended the current wait
        self.wait_warning = math.inf  #: seconds a wait may last before ``on_long_wait`` is told
        #: Told ``(kind, event, waited, seconds)`` when a wait passes ``wait_warning``.
        self.on_long_wait: Callable[[WaitKind, Event | None, list[Counted], float], None] | None
        self.on_long_wait = None

    def wait(self, targets: Sequence[tuple[Counted, int]], kind: WaitKind,
             event: Event | None = None) -> None:
        """Block until each queue (or destination) of ``targets`` has ``done`` its target.

        Raises:
            Stopped: The session is stopping.
        """
        with self._lock:
            for waited, target in targets:
                waited.wait_done = target
                if waited.done < target and not waited.abandoned:
                    self._waiting.add(waited)
        try:
            if self._waiting:
                self._block(kind, event)
        finally:
            with self._lock:
                for waited, _ in targets:
                    waited.wait_done = None
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
                    waited = list(self._waiting)
                self.on_long_wait(kind, event, waited, after)
                self._signal.get()
        elapsed = _perf() - t0
        counters = self.counters
        if kind in ("backpressure", "records"):
            counters.backpressure_wait += elapsed
            row = "backpressure"
        else:
            counters.barrier_wait += elapsed
            counters.barrier_waits += 1
            row = "barrier"
        if counters.trace is not None:
            counters.trace.producer_wait(row, t0, elapsed)
        last, self._last = self._last, None
        if last is not None:
            last.wait_caused += elapsed
        if self.stopping:
            raise Stopped

    def reached(self, waited: Counted, by: Member | None) -> None:
        """``waited`` reached its target with an item or record of ``by`` (any thread)."""
        with self._lock:
            if waited in self._waiting:
                self._waiting.discard(waited)
                if not self._waiting:
                    self._last = by
                    self._signal.put(True)

    def fail(self, exc: BaseException, handler: Handler | None, event: Event | None) -> None:
        """Record a handler's exception and stop the training thread at its next event
        (the caller marks the handler's lane failed). A :class:`Stopped` that reaches a
        handler while the session stops is the bus unwinding it: it is not recorded."""
        if isinstance(exc, Stopped) and self.stopping:
            return
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
