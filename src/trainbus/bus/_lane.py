"""A lane: one callback's queue of work items for one session, and who may run them.

A lane's items run one at a time, in queue order (D1). Exactly one party runs them at any
moment, decided by the lane's ``state`` under the lane's lock:

- ``IDLE``: nobody runs the lane. Items may sit in it unwoken (deferred cheap handlers).
- ``ACTIVE``: its driver (the lane's thread, or a dispatcher task on the loop) runs it.
- ``CLAIMED``: another thread runs its items itself: the training thread, for the inline
  fast path and for plain ``@blocking`` handlers.

Transitions happen under ``lock`` only, so two parties never both leave ``IDLE``. The hot
path stays lock-free: a producer appends, then reads ``state`` without the lock, and takes
the lock only when it reads ``IDLE``. That is safe because a driver going idle sets ``IDLE``
first and then looks at the queue once more (:meth:`Lane.take`): an item appended before
the producer read ``ACTIVE`` is seen by that second look.

Counting: ``enq`` (written by the producer) and ``done`` (written by whoever runs the lane)
count event items; ``log_enq``/``log_done`` count records, from any thread (D12). The
producer waits for these counts through the gate (``_gate.py``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from functools import partial
from queue import SimpleQueue
from typing import TYPE_CHECKING, Final

import anyio

if TYPE_CHECKING:
    from trainbus.bus._items import WorkItem
    from trainbus.bus._slot import Member

__all__ = ["ACTIVE", "CLAIMED", "IDLE", "PAY_RECHECK", "Lane", "would_deadlock"]

IDLE: Final = 0
ACTIVE: Final = 1
CLAIMED: Final = 2
#: Seconds between looks at stopping and cycles while a loop lane pays what it owes (D12).
PAY_RECHECK = 0.05


class Lane:
    """The per-session queue and run state of one callback (see the module docstring)."""

    __slots__ = (
        "abandoned",
        "current",
        "deferred",
        "done",
        "due",
        "enq",
        "exclusive",
        "failed",
        "index",
        "last_batch",
        "last_by_lag",
        "lock",
        "log_done",
        "log_enq",
        "log_slot",
        "member",
        "name",
        "notify",
        "on_thread",
        "owes",
        "pending",
        "producer_only",
        "records_deferred",
        "room",
        "room_waiters",
        "room_wakers",
        "scope",
        "slots",
        "state",
        "thread",
        "tokens",
        "uniform",
        "wait_done",
        "wait_log",
        "waiting_on",
        "wake_driver",
        "want_claim",
    )

    def __init__(self, member: Member) -> None:
        self.member = member
        self.name = member.name
        self.index = member.index
        self.slots = member.slots
        self.log_slot = member.log_slot
        self.on_thread = member.on_thread
        self.pending: deque[WorkItem] = deque()
        # Invariant: changes only under ``lock``; read without it only as described above.
        self.state: int = IDLE
        self.lock = threading.Lock()
        #: Set by the session: wakes the lane's driver after a move to ACTIVE.
        self.wake_driver: Callable[[Lane], None] = _unstarted
        #: Set by the session: tells the gate a wait target was reached (or a hand-over).
        self.notify: Callable[[Lane], None] = _unstarted
        # Invariant: written under ``lock``; a driver going idle hands the lane over as
        # CLAIMED (and tells the gate) instead of going IDLE while it is set.
        self.want_claim = False
        self.enq = 0
        self.done = 0
        # Invariant: ``log_enq`` changes under ``lock`` (records come from any thread);
        # ``log_done`` only on the thread running the lane.
        self.log_enq = 0
        self.log_done = 0
        #: Threads other than the producer wait here for room among its records (D12).
        self.room = threading.Condition(threading.Lock())
        self.room_waiters = 0
        #: Called (any thread) as records are taken while loop lanes wait for room here.
        self.room_wakers: list[Callable[[], None]] = []
        #: A loop lane whose handler logged past a destination's bound: that destination,
        #: which its dispatcher waits for before the lane's next item (``_records.py``).
        self.owes: Lane | None = None
        #: The destination this lane waits for room in now (cycle checks, ``_records.py``).
        self.waiting_on: Lane | None = None

        self.wait_done: int | None = None
        self.wait_log: int | None = None
        #: Holds items queued without a wake-up (run at the next barrier; ``_inline.py``).
        self.deferred = False
        #: Holds records queued without a wake-up (``InlinePath.defer_records``).
        self.records_deferred = False
        # Invariant: event items are queued by the producer only, records only on
        # destinations (from any thread), close items only after the producer is done, and
        # the timer wakes only lanes holding deferred items. So a lane that is not a
        # destination, IDLE with ``enq == done``, holds nothing, and only the producer moves
        # it out of IDLE: the producer may claim it without the lock (``InlinePath.run_here``).
        self.producer_only = member.log_slot is None
        # Invariant: an ``exclusive`` lane is never queued on while the producer publishes:
        # it is ``producer_only`` and every event handler is a plain ``@blocking`` one with no
        # filter, which the producer runs itself (``Member.exclusive``). So the producer
        # claims it without the lock and without looking at its counts
        # (``Producer._run_exclusive``).
        self.exclusive = member.exclusive
        assert not self.exclusive or self.producer_only
        #: Whether every slot has lag 0 (then a barrier waits for ``enq``).
        self.uniform = member.lags == frozenset({0})
        #: Per lag: the ``enq`` count after the lane's last item of that lag.
        self.last_by_lag = dict.fromkeys(member.lags, 0)
        #: Per lag > 0: ``(due batch, enq count)`` marks pushed at each ``BATCH_END``.
        self.due: dict[int, deque[tuple[int, int]]] = {k: deque() for k in member.lags if k}
        self.last_batch = 0
        #: The cancel scope of the coroutine handler running now, if any (D11).
        self.scope: anyio.CancelScope | None = None
        self.thread: threading.Thread | None = None
        #: A thread lane's wake-up tokens (its driver sleeps on ``tokens.get()``).
        self.tokens: SimpleQueue[None] = SimpleQueue()
        #: Set when the lane missed its close deadline: nobody waits for it any more.
        self.abandoned = False
        #: The handler its driver runs now (``"Class.method"``), for messages; else ``None``.
        self.current: str | None = None
        #: Set when one of its handlers raised: it runs nothing more but its close (D10).
        self.failed = False

    # -- the run state ---------------------------------------------------------------------

    def wake(self) -> None:
        """After appending: make sure somebody runs the lane (any thread)."""
        if self.state == IDLE and self.activate():
            self.wake_driver(self)

    def activate(self) -> bool:
        """Move an idle lane to ``ACTIVE``; return whether this call did (then the caller
        must wake the driver, at once or at the end of its burst)."""
        with self.lock:
            if self.state != IDLE:
                return False
            self.state = ACTIVE
            return True

    def take(self) -> WorkItem | None:
        """The driver's next item, or ``None`` once the lane left ``ACTIVE`` (driver only).

        Going idle, the lane is handed to a waiting claimer (``want_claim``) as ``CLAIMED``;
        see :meth:`go_idle`.
        """
        pending = self.pending
        while True:
            if pending:
                return pending.popleft()
            if not self.go_idle():
                return None

    def go_idle(self) -> bool:
        """Leave ``ACTIVE`` with an empty queue; return whether to keep running after all.

        Returns true when an item arrived meanwhile and nobody else woke the lane.
        """
        with self.lock:
            if self.pending:
                return True
            self.state = CLAIMED if self.want_claim else IDLE
            if self.want_claim:
                self.want_claim = False
                claimed = True
            else:
                claimed = False
        if claimed:
            self.notify(self)
            return False
        if not self.pending:
            return False
        with self.lock:  # an item arrived after the first look
            if self.state != IDLE:
                return False  # its producer woke the lane: that wake-up is ours to take
            self.state = ACTIVE
            return True

    def try_claim(self, *, allow_pending: bool = False) -> bool:
        """Claim an idle lane to run its items on this thread (usually the producer)."""
        if self.state != IDLE:
            return False
        with self.lock:
            if self.state != IDLE or (self.pending and not allow_pending):
                return False
            self.state = CLAIMED
            return True

    def claim_or_ask(self) -> bool:
        """Claim the lane now, or ask its driver to hand it over when it goes idle.

        Returns whether the lane is claimed now; otherwise ``want_claim`` is set and the
        driver will hand it over (and tell the gate).
        """
        with self.lock:
            if self.state == IDLE and not self.pending:
                self.state = CLAIMED
                return True
            if self.state == IDLE:  # deferred items: its driver runs them first
                self.state = ACTIVE
                self.want_claim = True
                wake = True
            else:
                self.want_claim = True
                wake = False
        if wake:
            self.wake_driver(self)
        return False

    def withdraw_claim(self) -> None:
        """Take back :meth:`claim_or_ask` (the waiting producer is unwinding)."""
        with self.lock:
            self.want_claim = False
            claimed = self.state == CLAIMED
        if claimed:
            self.release()

    def release(self) -> None:
        """Give a claimed lane back; wake its driver if items arrived meanwhile.

        No lock: only the claimer leaves ``CLAIMED``, and a waker that read ``CLAIMED``
        before this store is covered by the look at the queue after it.
        """
        self.state = IDLE
        if self.pending:
            self.wake()

    # -- lags (producer; ``@trailing`` slots) ---------------------------------------------

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

    # -- counting (whoever runs the lane) --------------------------------------------------

    def count_done(self) -> None:
        """Count one finished (or skipped) event item; tell the gate at its target."""
        self.done += 1
        target = self.wait_done
        if target is not None and self.done >= target:
            self.notify(self)

    def count_log_done(self) -> None:
        """Count one delivered (or skipped) record; tell whoever waits for room."""
        self.log_done += 1
        target = self.wait_log
        if target is not None and self.log_done >= target:
            self.notify(self)
        if self.room_waiters:
            with self.room:
                self.room.notify_all()
        if self.room_wakers:
            for waker in tuple(self.room_wakers):
                waker()

    def add_record(self, item: WorkItem, defer: Callable[[Lane], bool] | None = None,
                   burst: int = 1, here: Callable[[Lane], bool] | None = None) -> None:
        """Queue a record (any thread) and wake the lane, or, with ``defer``, leave an idle
        lane asleep while fewer than ``burst`` records wait and ``defer(lane)`` lists it;
        with ``here`` (the producer), ``here(lane)`` runs them instead of a wake-up if it can."""
        with self.lock:
            self.log_enq += 1
        self.pending.append(item)
        if self.state == IDLE and not (
            defer is not None and self.log_enq - self.log_done < burst and defer(self)
        ) and not (here is not None and here(self)):
            self.wake()

    def wait_for_room(self, bound: int, give_up: Callable[[], bool]) -> None:
        """Block this (non-producer, non-loop) thread until fewer than ``bound`` records
        wait here, or ``give_up()`` (checked every 50 ms) says to stop waiting."""
        with self.room:
            self.room_waiters += 1
            try:
                while self.log_enq - self.log_done >= bound and not give_up():
                    self.room.wait(0.05)
            finally:
                self.room_waiters -= 1

    async def pay(self, dest: Lane, bound: int, stopping: Callable[[], bool],
                  call_soon: Callable[[Callable[[], object]], None]) -> None:
        """On the loop: pause this loop lane until fewer than ``bound`` records wait in
        ``dest`` (what it ``owes``, ``_records.py``), or stopping, ``dest`` failing or a
        cycle of waiting lanes ends the wait.

        ``dest`` wakes the pause as it takes records (``room_wakers``, through
        ``call_soon``); a look every ``PAY_RECHECK`` seconds notices the rest.
        """
        self.waiting_on = dest
        try:
            while (
                dest.log_enq - dest.log_done >= bound
                and not (stopping() or dest.failed or dest.abandoned)
                and not would_deadlock(self, dest)
            ):
                room = anyio.Event()
                waker = partial(call_soon, room.set)
                dest.room_wakers.append(waker)
                try:
                    with anyio.move_on_after(PAY_RECHECK):
                        await room.wait()
                finally:
                    dest.room_wakers.remove(waker)
        finally:
            self.waiting_on = None


def would_deadlock(waiter: Lane | None, dest: Lane) -> bool:
    """Whether ``waiter`` waiting for room in ``dest`` could wait for ever: ``dest`` is
    ``waiter`` or claimed by the training thread, or waits, through a chain of lanes
    waiting for room, for ``waiter`` or a claimed lane."""
    lane: Lane | None = dest
    hops = 0
    while lane is not None and hops < 64:
        if lane is waiter or lane.state == CLAIMED:
            return True
        lane = lane.waiting_on
        hops += 1
    return hops >= 64


def _unstarted(lane: Lane) -> None:
    raise RuntimeError(f"lane {lane.name} has no running session")
