"""Driving a handler's coroutine step by step from the dispatcher.

The dispatcher runs a coroutine handler's first step itself and, if it suspends, keeps
driving it with ``await Resume(coro, yielded)`` in the task that started it
(``_dispatcher.py``). While the coroutine runs, ``dispatcher.running`` names its lane, so a
record it logs is charged to that lane (``_records.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from trainbus.bus._items import CallItem, EventItem

if TYPE_CHECKING:
    from trainbus.bus._items import WorkItem
    from trainbus.bus._lane import Lane

__all__ = ["FRESH", "DispatcherTask", "Resume", "Spare", "item_label"]


class Tracker(Protocol):
    """What ``Resume`` tells which lane runs (the dispatcher)."""

    running: Lane | None

#: ``Resume``'s ``yielded`` for a coroutine not started yet.
FRESH: Any = object()


class Resume:
    """Await a coroutine that was already started and is suspended at ``yielded``.

    While the coroutine runs, ``dispatcher.running`` names its lane (``_records.py``).
    """

    __slots__ = ("coro", "dispatcher", "lane", "yielded")

    def __init__(
        self,
        coro: Coroutine[Any, Any, Any],
        yielded: Any,
        lane: Lane | None = None,
        dispatcher: Tracker | None = None,
    ) -> None:
        self.coro = coro
        self.yielded = yielded
        self.lane = lane
        self.dispatcher = dispatcher

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, value = self.coro, self.yielded
        step = self._step
        if value is FRESH:
            done, value = step(coro.send, None)
            if done:
                return value
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:
                done, value = step(coro.throw, exc)
            else:
                done, value = step(coro.send, sent)
            if done:
                return value

    def _step(self, resume: Callable[[Any], Any], arg: Any) -> tuple[bool, Any]:
        """Resume the coroutine once; return ``(finished, its result or what it yielded)``."""
        tracker = self.dispatcher
        if tracker is not None:
            tracker.running = self.lane
        try:
            return False, resume(arg)
        except StopIteration as stop:
            return True, stop.value
        finally:
            if tracker is not None:
                tracker.running = None


class DispatcherTask:
    """What one turn of a dispatcher task is doing: its scope, and the lane item it owns."""

    __slots__ = ("item", "lane", "scope", "t0")

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()
        self.lane: Lane | None = None
        self.item: WorkItem | None = None
        self.t0 = 0.0


class Spare:
    """A parked dispatcher task's wake-up, and whether it was handed the dispatcher's role
    (else :meth:`Dispatcher.stop` woke it to end)."""

    __slots__ = ("event", "handed")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.handed = False


def item_label(lane: Lane, item: WorkItem) -> str | None:
    """The handler an item runs, as ``"Class.method"`` (for messages), if it names one."""
    if isinstance(item, EventItem):
        return lane.slots[item.event].handler.qualname
    if isinstance(item, CallItem):
        return item.label or None
    return None
