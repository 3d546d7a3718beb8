"""The lane threads: a bounded pool of threads, each pinned to the callbacks it serves.

A callback with plain handlers (``members.py``: ``Member.on_thread``) runs them on one
:class:`LaneThread` for the whole session. Which one is a rule of the callback list, never
of time (:func:`place`): the pooled callbacks, in list order, go round the pool's
``lane_threads`` threads (callback k on thread k mod size); a callback that declares
``own_thread = True`` gets a thread of its own. So a fit has at most ``lane_threads`` pool
threads, plus one per ``own_thread`` callback, whatever the number of callbacks.

A lane thread's work is one FIFO, ``pending``, in the order it was queued (so each of its
callbacks' items keep their order, D1, and callbacks of one event run in list order), and
one :class:`~trainbus.bus.lanes.Counts` counts its event items for all its callbacks (each
lane's ``counts`` is the thread's): the training thread counts an event once per thread,
and a barrier waits for each thread once, however many callbacks it serves.

- an :class:`~trainbus.bus.lanes.EventItem` alone means "every callback of this thread
  whose handler of that event is only queued" (``Producer.plan``): the training thread
  appends it once per thread, not once per callback, and the thread runs those handlers
  in list order (``subs``);
- a ``(lane, item)`` pair is one callback's item: a filtered, lagging or ``@blocking``
  handler's event, a record, a close call, a drain mark;
- ``STOP`` ends the thread.

An event that no callback of a thread handles puts nothing there and wakes nothing.

Why eight threads by default (``options.DEFAULT_LANE_THREADS``): eight plain callbacks that
block at once all run at once (D2's test meets eight at a barrier), and past a few threads
more only add wake-ups (``docs/performance-notes.md``, "Where the bus's numbers come
from").
The thread sleeps on ``sleeper`` when ``pending`` is empty; the producer wakes the threads
by its rule (``producer.INSIDE_BATCH``): one wake-up hands a thread everything queued since.

The wake-up chain (:class:`WakeChain`): when the producer wakes the threads by its rule (or
before the training thread waits), it wakes only the first thread that sleeps with work, in
pool order; that thread, as it leaves its sleep and before it runs anything, wakes the next
one after it, and so on. So every thread with work is woken, each before the one ahead of
it runs a handler (eight handlers that block at once still all run at once, D2), and the
training thread pays one wake-up a publish, not one per thread (a woken thread takes the
GIL from whoever woke it: eight woken from the training thread took it from the training
thread in turn; ``docs/concurrency.md``, "Lane threads"). A thread woken for one of its own
items (``put``: a record, a close call) passes nothing on: the other threads' items wait
for the producer's next wake-up, as its rule says.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from trainbus.bus.lanes import STOP, Counts
from trainbus.bus.threads import start_thread as _start
from trainbus.core.exceptions import LaneThreadError

if TYPE_CHECKING:
    from trainbus.bus.lanes import Lane, WorkItem
    from trainbus.bus.members import Slot
    from trainbus.core.events import Event

__all__ = ["LaneThread", "LaneThreadError", "Sub", "WakeChain", "place", "start_thread"]

#: One handler a lane thread runs for a bare ``EventItem``: ``(lane, slot, slot.fn,
#: slot.is_async, lane.member.shares_thread)``, the last three read once at planning
#: (``Producer``), not once a call.
Sub = tuple["Lane", "Slot", Callable[..., Any], bool, bool]

class LaneThread:
    """One thread of the pool (or a callback's own) and the callbacks pinned to it.

    Attributes:
        lanes: Its callbacks' lanes, in list order.
        counts: The event items of its FIFO, for all its callbacks (their lanes' ``counts``).
        subs: Per event, the handlers (:data:`Sub`) it runs for a bare ``EventItem``
            (set by ``Producer``, from its plan).
        pending: Its FIFO (see the module docstring): the training thread appends bare
            items, any thread appends pairs; only this thread takes from it.
        idle: Whether it sleeps (or is about to): set before its second look at
            ``pending``, so an append either is seen or sees it sleep.
        waiting_on: The destination whose room one of its handlers waits for (records).
        chain: The session's :class:`WakeChain` (``None`` outside a session).
        place: Its index in the chain's ``threads``: it may wake those after it as it
            leaves its sleep.
        passed: The last of the chain's wake-ups (``WakeChain.started``) it passed on.
        name: The thread's name: ``trainbus-lane-<Callback>`` for one callback,
            ``trainbus-lane-<First>+<n>`` for a pool thread serving n more.
    """

    __slots__ = ("chain", "counts", "idle", "lanes", "name", "passed", "pending", "place",
                 "sleeper", "subs", "thread", "waiting_on")

    def __init__(self, lanes: Sequence[Lane]) -> None:
        self.lanes = list(lanes)
        first = self.lanes[0].name
        more = len(self.lanes) - 1
        self.name = f"trainbus-lane-{first}" + (f"+{more}" if more else "")
        self.subs: dict[Event, list[Sub]] = {}
        self.pending: deque[Any] = deque()
        self.idle = False
        self.sleeper = threading.Lock()
        self.sleeper.acquire()
        self.waiting_on: Lane | None = None
        self.thread: threading.Thread | None = None
        self.chain: WakeChain | None = None
        self.place = 0
        self.passed = 0
        self.counts = Counts(self.lanes, self.lanes[0].gate)
        for lane in self.lanes:
            lane.runner = lane.thread = self
            lane.counts = self.counts

    def put(self, lane: Lane, item: WorkItem) -> None:
        """Queue one callback's item and wake the thread if it sleeps (any thread)."""
        self.pending.append((lane, item))
        if self.idle:  # after the append: see ``idle``
            self.wake()

    def stop(self) -> None:
        """Queue ``STOP``: the thread ends once it has run what was queued before."""
        self.pending.append(STOP)
        self.wake()

    def sleep(self) -> None:
        """This thread: sleep until :meth:`wake`, unless something was queued; then, before
        running anything, pass the chain's latest wake-up on (:class:`WakeChain`). Looked at
        also when it did not sleep: the chain may have woken it while it looked."""
        self.idle = True  # before the second look: an append either is seen or sees idle
        if not self.pending:
            self.sleeper.acquire()
        self.idle = False
        chain = self.chain
        if chain is not None and chain.started != self.passed:
            self.passed = chain.started
            wake_first(chain.threads, self.place + 1)

    def wake(self) -> None:
        """Wake the thread, which sleeps or is about to (any thread).

        A thread woken and not yet running is woken again at each later publish that wakes
        threads (``BATCH_END`` then ``BATCH_CHECKPOINT``, say): the look at ``locked()``
        spares the ``RuntimeError`` of a second release, which costs the caller more than
        the wake-up itself and depends on how soon the woken thread runs."""
        sleeper = self.sleeper
        if sleeper.locked():
            try:
                sleeper.release()
            except RuntimeError:  # released meanwhile by another thread
                pass

    def busy_with(self) -> str | None:
        """The handler one of its callbacks runs now (``"Class.method"``), if any."""
        for lane in self.lanes:
            if lane.current is not None:
                return lane.current
        return None


def place(lanes: Sequence[Lane], size: int) -> list[LaneThread]:
    """The lane threads of a session: the thread lanes round a pool of ``size`` threads,
    in list order, and one thread for each lane whose callback asks for its own."""
    pooled = [lane for lane in lanes if lane.on_thread and not lane.member.own_thread]
    groups: list[list[Lane]] = [[] for _ in range(min(size, len(pooled)))]
    for k, lane in enumerate(pooled):
        groups[k % size].append(lane)
    threads = [LaneThread(group) for group in groups]
    threads += [LaneThread([lane]) for lane in lanes if lane.on_thread and lane.member.own_thread]
    return threads


class WakeChain:
    """How the producer wakes a session's lane threads (module docstring): it wakes the
    first that sleeps with work; each one it wakes passes the wake-up on as it wakes.

    Every thread that sleeps with work when :meth:`start` is called is woken: it sleeps
    until released, so the first wakes and, having seen ``started`` move (read after it
    stops sleeping, which the producer saw it had not yet done, so after the producer
    moved it), wakes the next such thread after it, and so on to the last. A thread that
    runs already is passed over: it runs what was queued for it without a wake-up.

    Attributes:
        threads: The session's lane threads, in pool order (``place``).
        started: How many wake-ups the producer started down the chain.
    """

    __slots__ = ("started", "threads")

    def __init__(self, threads: Sequence[LaneThread]) -> None:
        self.threads = list(threads)
        self.started = 0
        for k, thread in enumerate(self.threads):
            thread.chain = self
            thread.place = k

    def start(self) -> None:
        """Wake the first thread that sleeps with work (the publishing thread)."""
        self.started += 1  # before the look at the threads: see the class docstring
        wake_first(self.threads)


def wake_first(threads: Sequence[LaneThread], start: int = 0) -> None:
    """Wake the first of ``threads[start:]`` that sleeps (or is about to) with work queued."""
    for k in range(start, len(threads)):
        thread = threads[k]
        if thread.idle and thread.pending:
            thread.wake()
            return


def start_thread(target: Callable[..., None], args: tuple[Any, ...], name: str,
                 needed: int) -> threading.Thread:
    """Start a daemon thread for the bus, or raise :class:`LaneThreadError` naming the
    limit the operating system enforces (``needed``: the threads this fit starts).

    Raises:
        LaneThreadError: The thread could not be started (``bus.threads.start_thread``).
    """
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    return _start(
        thread,
        needed=f"This fit needs {needed} threads of the bus: lower Trainer(lane_threads=...) "
        "(the pool of threads plain callbacks share; callbacks that set own_thread = True "
        "add one each)",
        error=LaneThreadError,
    )

