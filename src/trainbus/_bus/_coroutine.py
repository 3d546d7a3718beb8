"""Driving a handler's coroutine step by step from the dispatcher.

The dispatcher runs a coroutine handler's first step itself and, if it suspends, keeps
driving it with ``await Resume(coro, yielded)`` in the task that started it
(``_dispatcher.py``). While the coroutine runs, ``dispatcher.running`` names its lane, so a
record it logs is charged to that lane (``_records.py``).
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from trainbus._bus._lane import Lane

__all__ = ["FRESH", "Resume"]


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
        dispatcher, lane = self.dispatcher, self.lane
        if value is FRESH:
            if dispatcher is not None:
                dispatcher.running = lane
            try:
                value = coro.send(None)
            except StopIteration as stop:
                return stop.value
            finally:
                if dispatcher is not None:
                    dispatcher.running = None
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:
                if dispatcher is not None:
                    dispatcher.running = lane
                try:
                    value = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
                finally:
                    if dispatcher is not None:
                        dispatcher.running = None
            else:
                if dispatcher is not None:
                    dispatcher.running = lane
                try:
                    value = coro.send(sent)
                except StopIteration as stop:
                    return stop.value
                finally:
                    if dispatcher is not None:
                        dispatcher.running = None
