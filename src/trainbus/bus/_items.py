"""The work items a lane runs, one class per kind.

A lane's queue holds these, in publication order. Items are immutable and may be shared:
one :class:`EventItem` is built per published event and appended to the queue of every lane
that handles it (each lane finds its handler by the event), and one :class:`LogItem` per
logged record goes to every destination. So publishing costs one small object per event,
not one per handler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from trainbus.core.events import Event
    from trainbus.core.logger import Logger, LogRecord
    from trainbus.core.state import State

__all__ = ["STOP", "CallItem", "EventItem", "LogItem", "StopItem", "WorkItem"]


class EventItem:
    """One published event: the state as of its publication and a logger bound to it.

    ``batch`` is the batch count at publication (for the lag statistics).
    """

    __slots__ = ("batch", "event", "logger", "view")

    def __init__(self, event: Event, view: State, logger: Logger, batch: int) -> None:
        self.event: Final = event
        self.view: Final = view
        self.logger: Final = logger
        self.batch: Final = batch


class LogItem:
    """One logged record for every destination (counted in each one's ``log_enq``)."""

    __slots__ = ("record",)

    def __init__(self, record: LogRecord) -> None:
        self.record: Final = record


class CallItem:
    """A call the loop makes in a lane's order (``close``, ``post_close``, a drain mark).

    ``fn()`` is called (and awaited if ``is_async``); then ``on_done(error)`` on the loop.
    """

    __slots__ = ("fn", "is_async", "label", "on_done")

    def __init__(
        self,
        fn: Callable[[], Any],
        is_async: bool,
        on_done: Callable[[BaseException | None], None],
        label: str = "",
    ) -> None:
        self.fn: Final = fn
        self.is_async: Final = is_async
        self.on_done: Final = on_done
        #: What the call is, for messages (``"Upload.close"``).
        self.label: Final = label


class StopItem:
    """Ends a lane thread's driver (the last item it takes)."""

    __slots__ = ()


STOP: Final = StopItem()

WorkItem = EventItem | LogItem | CallItem | StopItem
