"""A subscriber's end of an :class:`~trainbus.callbacks.EventStream`: a bounded buffer.

Split out of ``event_stream.py``; users get :class:`Subscription` from
``EventStream.subscribe()``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Literal

import anyio
import anyio.lowlevel

from trainbus.callbacks._stream_items import StreamEvent, StreamGap, StreamItem, StreamMetrics
from trainbus.core.exceptions import StreamOverflowError

__all__ = ["Subscription"]

OverflowPolicy = Literal["drop_oldest", "latest", "disconnect"]
_POLICIES = ("drop_oldest", "latest", "disconnect")


class Subscription:
    """One subscriber's bounded buffer: an async iterator of stream items.

    Iteration ends when the run closes (after the buffered items). When the buffer is full:

    - ``on_overflow="drop_oldest"``: the oldest buffered item is dropped;
    - ``"latest"``: the oldest buffered item that the new one makes stale is dropped (a
      ``metrics`` item whose names the new ``metrics`` item all logs again, or the same
      event, e.g. an older ``batch_end``), else the oldest, so that a live view keeps the
      newest value of each name (what a destination's ``Backpressure.latest`` does);
    - ``"disconnect"``: the subscriber is removed and, after its buffered items, iteration
      raises :class:`StreamOverflowError`.

    Items lost are counted in :attr:`dropped` and announced by a :class:`StreamGap` before
    the next item received. Use it with ``async with`` to unsubscribe early.

    Attributes:
        dropped: Items this subscriber lost so far.
        disconnected: Whether it was disconnected for falling behind.

    Example:
        >>> async with stream.subscribe(buffer_size=64) as sub:
        ...     async for item in sub:
        ...         await websocket.send_text(item.to_json())
    """

    __slots__ = (
        "_buffer",
        "_ended",
        "_missed",
        "_size",
        "_stream",
        "_wakeup",
        "disconnected",
        "dropped",
        "policy",
    )

    def __init__(
        self,
        unsubscribe: Callable[[Subscription], None] | None,
        buffer_size: int,
        policy: str,
    ) -> None:
        #: Takes this subscription off its stream (``None``: the run has ended).
        self._stream = unsubscribe
        self._buffer: deque[StreamItem] = deque()
        self._size = buffer_size
        self.policy = policy
        self._missed = 0
        self._ended = unsubscribe is None
        self._wakeup: anyio.Event | None = None
        self.dropped = 0
        self.disconnected = False

    @property
    def pending(self) -> int:
        """Items buffered and not yet received."""
        return len(self._buffer)

    @property
    def ended(self) -> bool:
        """Whether no new item will arrive (the run closed, or it was disconnected)."""
        return self._ended

    def _push(self, item: StreamItem) -> bool:
        """Buffer ``item``; returns ``False`` if the subscriber is disconnected."""
        buffer = self._buffer
        if len(buffer) >= self._size:
            if self.policy == "disconnect":
                self.disconnected = True
                self._end()
                return False
            if self.policy == "latest":
                del buffer[_stale(buffer, item)]
            else:
                buffer.popleft()
            self.dropped += 1
            self._missed += 1
        buffer.append(item)
        wakeup = self._wakeup
        if wakeup is not None:
            self._wakeup = None
            wakeup.set()
        return True

    def _end(self) -> None:
        self._ended = True
        self._stream = None
        wakeup = self._wakeup
        if wakeup is not None:
            self._wakeup = None
            wakeup.set()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> StreamItem:
        await anyio.lowlevel.checkpoint_if_cancelled()
        while True:
            if self._missed:
                missed, self._missed = self._missed, 0
                return StreamGap(missed)
            if self._buffer:
                return self._buffer.popleft()
            if self.disconnected:
                raise StreamOverflowError(
                    f"this subscriber fell {self._size} items behind and was disconnected "
                    "(on_overflow='disconnect'); read faster, raise buffer_size=..., or use "
                    "on_overflow='drop_oldest'"
                )
            if self._ended:
                raise StopAsyncIteration
            wakeup = self._wakeup = anyio.Event()
            await wakeup.wait()

    def take_ready(self) -> list[StreamItem]:
        """The items buffered now, without waiting (a :class:`StreamGap` first if any were
        dropped): lets a writer send a burst in one write after ``__anext__`` woke it."""
        ready: list[StreamItem] = []
        if self._missed:
            ready.append(StreamGap(self._missed))
            self._missed = 0
        ready.extend(self._buffer)
        self._buffer.clear()
        return ready

    def close(self) -> None:
        """Unsubscribe now: buffered items are discarded and iteration ends."""
        unsubscribe = self._stream
        if unsubscribe is not None:
            unsubscribe(self)
        self._buffer.clear()
        self._missed = 0
        self._end()

    async def aclose(self) -> None:
        """Async twin of :meth:`close`."""
        self.close()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _check_buffer_size(buffer_size: object) -> int:
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
        raise ValueError(f"buffer_size={buffer_size!r} must be an int >= 1 (items), e.g. 256")
    return buffer_size


def _stale(buffer: deque[StreamItem], new: StreamItem) -> int:
    """The index of the oldest buffered item that ``new`` makes stale, else 0 (the oldest)."""
    if isinstance(new, StreamMetrics):
        names = new.metrics.keys()
        for i, old in enumerate(buffer):
            if (
                isinstance(old, StreamMetrics)
                and old.hyperparameters == new.hyperparameters
                and old.metrics.keys() <= names
            ):
                return i
    elif isinstance(new, StreamEvent):
        for i, old in enumerate(buffer):
            if isinstance(old, StreamEvent) and old.event is new.event:
                return i
    return 0


def _check_policy(on_overflow: object) -> str:
    if on_overflow not in _POLICIES:
        raise ValueError(
            f"on_overflow={on_overflow!r} is not a policy; use 'drop_oldest', 'latest' or "
            "'disconnect' (a subscriber cannot hold training up: there is no 'block')"
        )
    return str(on_overflow)
