"""A slot: one callback's handler for one event, with its statistics and its policy state."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainbus.core.trailing import lag_of

if TYPE_CHECKING:
    from trainbus.core.callback import Handler, HandlerTable
    from trainbus.core.events import Event

__all__ = ["Member", "Slot", "due", "never"]


class Slot:
    """One handler of one callback, resolved once and kept for the engine's lifetime.

    The statistics (``calls``, ``total_time``, ``max_time``, ``inline_calls``) and the
    inline fast path's verdict (``inline_ok``, ``inline_banned``, see ``_inline.py``) are
    kept across ``fit()`` calls. Only the thread running the handler writes them.
    """

    __slots__ = (
        "calls",
        "event",
        "fn",
        "handler",
        "inline_banned",
        "inline_bans",
        "inline_calls",
        "inline_ok",
        "inline_strike",
        "inline_wait",
        "is_async",
        "is_blocking",
        "lag",
        "max_time",
        "qualname",
        "total_time",
        "when",
    )

    def __init__(self, handler: Handler, event: Event | None, lag: int = 0) -> None:
        self.handler = handler
        self.event = event
        self.fn = handler.fn
        self.qualname = handler.qualname
        self.is_async = handler.is_async
        self.is_blocking = handler.is_blocking
        #: The filter (``@every``/``@once``); replaced by a never-true one after ``@once``.
        self.when: Callable[[Any], bool] | None = handler.when
        #: Batches this handler may trail the ``BATCH_END`` barrier by.
        self.lag = lag
        self.calls = 0
        self.inline_calls = 0
        self.total_time = 0.0
        self.max_time = 0.0
        self.inline_ok = False
        self.inline_banned = False
        self.inline_strike = False
        #: While banned: calls left to sit out (``_inline.learn``); -1: for good.
        self.inline_wait = 0
        #: How often it was banned for slowness (each ban waits twice as long).
        self.inline_bans = 0

    def account(self, elapsed: float) -> None:
        """Count one finished call that took ``elapsed`` seconds."""
        self.calls += 1
        self.total_time += elapsed
        if elapsed > self.max_time:
            self.max_time = elapsed


class Member:
    """A registered callback: its handler slots, resolved once for the engine's lifetime.

    Attributes:
        table: The resolved handlers.
        name: The callback's class name (statistics, warnings, thread names).
        index: Its position in the callback list.
        slots: The slot per event it handles (none for events it ignores).
        log_slot: For a logger destination, the slot receiving log records.
        on_thread: Whether it runs on a thread lane (it has plain, non-blocking handlers).
        lags: The distinct lags (batches) of its slots.
        peak: The most event items ever queued at once for it, over every session.
        peak_records: For a destination, the most records ever queued at once for it.
        wait_caused: Seconds the producer waited with it the last lane it waited for.
        exclusive: Whether every handler is a plain ``@blocking`` one with no filter and it
            is no destination: the producer runs all its event handlers itself
            (``Lane.exclusive``), so each event call it made ran there.
    """

    __slots__ = (
        "exclusive",
        "index",
        "lags",
        "log_slot",
        "name",
        "on_thread",
        "peak",
        "peak_records",
        "slots",
        "table",
        "wait_caused",
    )

    def __init__(
        self, table: HandlerTable, index: int, log_handler: Handler | None, default_lag: int
    ) -> None:
        self.table = table
        self.name = table.name
        self.index = index
        self.slots = {
            event: Slot(h, event, lag_of(h, default_lag)) for event, h in table.handlers.items()
        }
        self.log_slot = Slot(log_handler, None) if log_handler is not None else None
        plain_log = log_handler is not None and not log_handler.is_async
        self.on_thread = table.has_sync or plain_log
        self.lags = frozenset(slot.lag for slot in self.slots.values()) or frozenset({0})
        self.exclusive = log_handler is None and all(
            slot.is_blocking and not slot.is_async and slot.when is None
            for slot in self.slots.values()
        )
        self.peak = 0
        self.peak_records = 0
        self.wait_caused = 0.0

    @property
    def is_destination(self) -> bool:
        """Whether it receives log records (a :class:`~trainbus.LoggerDestination`)."""
        return self.log_slot is not None

    def all_slots(self) -> list[Slot]:
        """Its event slots, then its log slot."""
        slots = list(self.slots.values())
        if self.log_slot is not None:
            slots.append(self.log_slot)
        return slots


def due(slot: Slot, when: Callable[[Any], bool], ts: Any) -> bool:
    """Whether a filtered handler runs for this event (``@once``: only the first time)."""
    if not when(ts):
        return False
    if getattr(when, "exact", False):
        slot.when = never
    return True


def never(ts: Any) -> bool:
    """The filter of a ``@once`` handler that already ran."""
    return False
