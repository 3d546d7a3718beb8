"""Items handed from a destination's lane thread to the event loop, one wake-up per batch.

A destination whose ``log_record`` is a plain ``def`` always runs on a thread lane of its
own (placement is declared, ``docs/concurrency.md``): the bus wakes that thread for a
record instead of spending two event-loop iterations on it (the loop's self-pipe wake-up,
then the lane's task), and never runs the destination's records on the training thread.
:class:`Inbox` is how such a destination passes what it made of the records to its
batching, which lives on the loop: the lane thread appends (``put``), and wakes the loop
only once a request's worth of items has come (or hyperparameters, which are sealed at
once); the loop takes everything at that wake-up, at each ``flush_interval`` and at
``close``. The wake-up crosses into the loop through the bus's bridge
(:class:`~trainbus.core.bridge.LoopHandle`), the one module that does.

Thread safety: ``put`` runs on the lane's thread and ``take`` on the loop; the ``deque``
is the only shared structure (its ``append``/``popleft`` are atomic), and each counter has
one writer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from trainbus.core.bridge import LoopHandle

__all__ = ["Inbox"]


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
        self._loop: LoopHandle | None = None  # set while a loop takes the items
        self._on_loop: Callable[[], None] | None = None

    def attach(self, on_loop: Callable[[], None]) -> None:
        """Call ``on_loop()`` on the running loop whenever a batch is here (loop only)."""
        self._on_loop = on_loop
        self._loop = LoopHandle()

    def detach(self) -> None:
        """Stop waking the loop; items put from now on wait for the next ``take``."""
        self._loop = self._on_loop = None

    def put(self, items: list[Any], params: bool) -> None:
        """Queue ``items`` (``params``: hyperparameters); wake the loop once a batch is here."""
        self._parts.append((items, params))
        self.put_items += len(items)
        self._since_wake += len(items)
        if params or self._since_wake >= self._batch_size:
            self._since_wake = 0
            loop, on_loop = self._loop, self._on_loop
            if loop is not None and on_loop is not None:
                loop.call_soon_if_running(on_loop)  # nothing once the loop has ended

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
