"""Registered callbacks, resolved once: their handlers, where each runs, their statistics.

Where a handler runs is decided here, once, from how it is declared, and never changes (D7;
``docs/concurrency.md``, "What runs where"):

- a callback with any plain handler that is not ``@blocking`` (or a plain ``log_record``, or
  a plain ``close``) is pinned to one lane thread (``worker.place``), where all its plain
  handlers run; that thread hands its ``async def`` handlers to the event loop, in order;
- any other callback runs on the event loop, in a task of its own;
- a plain ``@blocking`` handler runs on the training thread, whatever its callback has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainbus.core.backpressure import backpressure_of
from trainbus.core.trailing import declared_lag, refuse_live_trailing

if TYPE_CHECKING:
    from trainbus.core.callback import Handler, HandlerTable
    from trainbus.core.events import Event

__all__ = ["Member", "Slot", "due", "own_thread_of"]


class Slot:
    """One handler of one callback, with its statistics (kept across ``fit()`` calls).

    Invariant: one thread at a time writes ``calls``, ``total_time`` and ``max_time``: its
    worker (``worker.finished``), or the training thread for a plain ``@blocking``
    handler (``Producer._run_here``); the training thread alone replaces ``when`` (``due``).
    """

    __slots__ = ("calls", "event", "fenced", "fn", "handler", "here", "is_async", "is_blocking",
                 "lag", "max_time", "qualname", "total_time", "when")

    def __init__(
        self, handler: Handler, event: Event | None, lag: int = 0, *, fenced: bool = True
    ) -> None:
        self.handler = handler
        self.event = event
        self.fn = handler.fn
        self.qualname = handler.qualname
        self.is_async = handler.is_async
        self.is_blocking = handler.is_blocking  # the training thread waits for it (D9)
        #: A plain ``@blocking`` handler: the training thread runs it itself.
        self.here = handler.is_blocking and not handler.is_async
        #: The filter (``@every``/``@once``); replaced by a never-true one after ``@once``.
        self.when: Callable[[Any], bool] | None = handler.when
        self.lag = lag  # batches it may trail the BATCH_END barrier by (@trailing)
        #: Whether its items finish before the training thread next zeroes the gradients
        #: (the live fence, ``producer.py``): every handler but a declared ``@trailing(k)``.
        self.fenced = fenced
        self.calls = 0
        self.total_time = 0.0
        self.max_time = 0.0


class Member:
    """A registered callback: its slots and its placement, for the engine's lifetime.

    Attributes:
        table: The resolved handlers.
        name: The callback's class name (statistics, warnings, thread names).
        index: Its position in the callback list.
        slots: The slot per event it handles (none for events it ignores).
        log_slot: For a logger destination, the slot receiving log records.
        backpressure: For a destination, its declared policy (``core/backpressure.py``).
        on_thread: Whether it runs on a lane thread (the module docstring's rule).
        own_thread: Whether that lane thread is its own (``own_thread = True``), not the pool's.
        shares_thread: Whether the training thread runs some of its plain handlers too
            (``@blocking``): then each item of its thread runs under its lane's lock (D1).
        lags: The distinct lags (batches) of its slots.
        peak, peak_records, wait_caused: Over the engine's life, what
            :class:`~trainbus.CallbackStatistics` reads as ``peak_pending`` (over the
            sessions that ended: a running one's is its queue's), ``peak_pending_records``
            and ``barrier_wait_caused``.
        records_dropped, records_coalesced, values_dropped, slow, slow_batches: The same,
            read into its fields of those names.

    Invariant: what ``__init__`` derives from the table never changes. ``peak`` is written
    by the loop at a session's end; ``wait_caused``, ``slow`` and ``slow_batches`` by the
    training thread; the ``records_*``/``values_dropped`` under the mailbox's lock;
    ``peak_records`` unlocked by any logging thread (two at once may keep the smaller).
    """

    __slots__ = ("backpressure", "index", "lags", "log_slot", "name", "on_thread", "own_thread",
                 "peak", "peak_records", "records_coalesced", "records_dropped", "shares_thread",
                 "slots", "slow", "slow_batches", "table", "values_dropped", "wait_caused")

    def __init__(
        self, table: HandlerTable, index: int, log_handler: Handler | None, default_lag: int
    ) -> None:
        self.table = table
        self.name = table.name
        self.index = index
        self.slots: dict[Event, Slot] = {}
        for event, h in table.handlers.items():
            declared = declared_lag(h)
            refuse_live_trailing(h, event, declared, f"callbacks[{index}]")
            lag = default_lag if declared is None else declared
            self.slots[event] = Slot(h, event, lag, fenced=not declared)
        self.log_slot = self.backpressure = None
        here = any(slot.here for slot in self.slots.values())
        if log_handler is not None:
            self.log_slot = Slot(log_handler, None)
            self.backpressure = backpressure_of(table.callback, f"callbacks[{index}]")
        # A destination with a @blocking handler gets a thread too: its records then run
        # under the lane's lock (``shares_thread``), never beside that handler (D1).
        self.on_thread = table.has_sync or (
            log_handler is not None and (here or not log_handler.is_async)
        )
        self.own_thread = self.on_thread and own_thread_of(table.callback, index)
        self.shares_thread = self.on_thread and here
        self.lags = frozenset(slot.lag for slot in self.slots.values()) or frozenset({0})
        self.peak = 0
        self.peak_records = 0
        self.records_dropped = self.records_coalesced = self.values_dropped = 0
        self.wait_caused = 0.0
        self.slow_batches = 0
        self.slow = False

    def all_slots(self) -> list[Slot]:
        """Its event slots, then its log slot."""
        slots = list(self.slots.values())
        if self.log_slot is not None:
            slots.append(self.log_slot)
        return slots


def own_thread_of(callback: object, index: int) -> bool:
    """The callback's ``own_thread`` declaration, checked.

    Raises:
        TypeError: ``own_thread`` is not a bool.
    """
    own = getattr(callback, "own_thread", False)
    if not isinstance(own, bool):
        raise TypeError(
            f"callbacks[{index}] ({type(callback).__qualname__}).own_thread={own!r} must be "
            "True (its plain handlers get a thread of their own) or False (they share the "
            "pool's lane threads, the default)"
        )
    return own


def due(slot: Slot, when: Callable[[Any], bool], ts: Any) -> bool:
    """Whether a filtered handler runs for this event (``@once``: only the first time)."""
    if not when(ts):
        return False
    if getattr(when, "exact", False):
        slot.when = _never
    return True


def _never(ts: Any) -> bool:  # the filter of a @once handler that already ran
    return False
