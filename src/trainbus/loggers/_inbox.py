"""Items handed from a destination's lane thread to the event loop, one wake-up per batch.

A destination whose ``log_record`` is a plain ``def`` runs on a thread lane of its own:
the bus hands it records in bursts with a cheap thread wake-up instead of an event-loop
iteration (a loop lane costs the loop two iterations per record: the self-pipe
wake-up, then the dispatcher task), or, once its calls proved cheap, the training thread
runs the burst itself (``docs/concurrency.md``). Either way one thread at a time.
:class:`Inbox` is how such a destination passes what it made of the records to its
batching, which lives on the loop: the lane appends (``put``), and wakes the loop only once
a request's worth of items has come (or hyperparameters, which are sealed at once); the
loop takes everything at that wake-up, at each ``flush_interval`` and at ``close``.

Thread safety: ``put`` runs on whoever runs the lane (one thread at a time: its own, or
the training thread while it holds the lane) and ``take`` on the loop; the ``deque`` is
the only shared structure (its ``append``/``popleft`` are atomic), and each counter has one
writer at a time.
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Inbox", "loop_caller"]


def loop_caller(fn: Callable[[], None]) -> Callable[[], None]:
    """A function that schedules ``fn()`` on the running event loop (asyncio or trio).

    Call the result from any thread: it returns at once; once the loop has ended it does
    nothing.
    """
    try:
        call: Callable[..., Any] = asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:
        trio = sys.modules["trio"]
        call = trio.lowlevel.current_trio_token().run_sync_soon

    def call_soon() -> None:
        try:
            call(fn)
        except Exception:  # asyncio: "Event loop is closed"; trio: RunFinishedError
            return

    return call_soon


class Inbox:
    """What a lane thread made of its records, waiting for the loop (module docstring).

    Args:
        batch_size: Items per wake-up of the loop.
    """

    def __init__(self, batch_size: int) -> None:
        self._parts: deque[tuple[list[Any], bool]] = deque()
        self._batch_size = batch_size
        self._since_wake = 0
        self.put_items = 0  # written by the putting thread only
        self.taken_items = 0  # written by the loop only
        #: Called (on the putting thread) to wake the loop; ``None`` while none runs.
        self.wake: Callable[[], None] | None = None

    def put(self, items: list[Any], params: bool) -> None:
        """Queue ``items`` (``params``: hyperparameters); wake the loop once a batch is here."""
        self._parts.append((items, params))
        self.put_items += len(items)
        self._since_wake += len(items)
        if params or self._since_wake >= self._batch_size:
            self._since_wake = 0
            wake = self.wake
            if wake is not None:
                wake()

    def take(self) -> Iterator[tuple[list[Any], bool]]:
        """Every ``(items, params)`` queued so far, oldest first (loop only)."""
        parts = self._parts
        while parts:
            items, params = parts.popleft()
            self.taken_items += len(items)
            yield items, params

    @property
    def pending(self) -> int:
        """Items put and not yet taken."""
        return self.put_items - self.taken_items
