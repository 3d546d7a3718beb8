"""``EventStream``: fans a run's events and logged metrics out to async subscribers.

The stream is a :class:`~trainbus.LoggerDestination` whose handlers are all ``async
def``: they run on the event loop and only append the new item to each subscriber's
bounded buffer and wake the subscriber. A subscriber that does not keep up loses its
oldest items (or is disconnected); neither training nor the other subscribers ever wait
for it. This is the one place in trainbus where something may be dropped: the bus never
drops (SPEC D12), the stream's subscribers may.

Example:
    >>> stream = EventStream(buffer_size=256)
    >>> trainer = Trainer(model, loader, "2ep", loss_fn=F.cross_entropy, loggers=[stream])
    >>> async def watch():
    ...     async for item in stream.subscribe():
    ...         print(item)        # StreamEvent(batch_end, epoch=0, batch=1) ...
    >>> async with anyio.create_task_group() as tg:
    ...     tg.start_soon(watch)
    ...     await trainer.fit()    # watch() ends when the run closes
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Iterable
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

from trainbus.callbacks._stream_items import (
    StreamBusSnapshot,
    StreamEvent,
    StreamGap,
    StreamItem,
    StreamMetrics,
    StreamStatistics,
    json_ready,
)
from trainbus.callbacks._subscription import (
    OverflowPolicy,
    Subscription,
    _check_buffer_size,
    _check_policy,
)
from trainbus.core.destination import LoggerDestination
from trainbus.core.events import Event
from trainbus.core.exceptions import StreamOverflowError
from trainbus.core.logger import LogRecord
from trainbus.core.renamed import renamed_option
from trainbus.core.trailing import LIVE_TENSOR_EVENTS

if TYPE_CHECKING:
    from trainbus.bus.engine import Engine
    from trainbus.callbacks._bus_feed import BusFeed
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = [
    "DEFAULT_STREAM_EVENTS",
    "EventStream",
    "StreamBusSnapshot",
    "StreamEvent",
    "StreamGap",
    "StreamItem",
    "StreamMetrics",
    "StreamOverflowError",
    "StreamStatistics",
    "Subscription",
]

#: The events an :class:`EventStream` publishes by default: run, epoch and evaluation
#: boundaries and one event per batch (``BATCH_END``). The events inside a batch
#: (dataloader, forward, loss, backward, per-microbatch and per-eval-batch events) and
#: the checkpoint events are left out: they are ten times as many and say little to a
#: dashboard. Pass ``events="all"`` (or a list) to choose.
DEFAULT_STREAM_EVENTS: frozenset[Event] = frozenset(
    {
        Event.INIT,
        Event.FIT_START,
        Event.EPOCH_START,
        Event.BATCH_END,
        Event.EPOCH_END,
        Event.EVAL_START,
        Event.EVAL_END,
        Event.FIT_END,
    }
)

_REOPEN = frozenset({Event.INIT, Event.FIT_START})

_Numbered = StreamEvent | StreamMetrics | StreamBusSnapshot
_ItemT = TypeVar("_ItemT", StreamEvent, StreamMetrics, StreamBusSnapshot)


def _resolve_events(events: Iterable[Event | str] | str | None) -> frozenset[Event]:
    if events is None:
        return DEFAULT_STREAM_EVENTS
    if events == "all":
        return frozenset(Event)
    if isinstance(events, str | Event):
        events = [events]
    chosen = set()
    for e in events:
        try:
            chosen.add(Event(e))
        except ValueError:
            raise ValueError(
                f"events=... contains {e!r}, which is not an event; use Event members or "
                f"their values ({', '.join(x.value for x in Event)}), or events='all'"
            ) from None
    return frozenset(chosen)


class EventStream(LoggerDestination):
    """Publishes a run's events and logged metrics to any number of async subscribers.

    Pass it in ``loggers=[...]`` so that it receives logged metrics too. Every handler
    is ``async def`` and only appends to buffers, so the stream runs on the event loop
    and never holds training up; a slow subscriber loses its oldest items (each loss is
    reported by a :class:`StreamGap` and counted in ``Subscription.dropped``) or, with
    ``on_overflow="disconnect"``, is cut off. Subscriptions end when the run closes
    (the ``close`` handler, which also runs after an error or a cancellation); a
    subscription taken after that ends at once. A new ``fit()`` (or a new trainer) reopens
    the stream at ``FIT_START`` (``INIT``). Subscribe and iterate on the event loop that
    runs ``fit()``.

    With ``history=n`` the stream keeps its last ``n`` items, and ``subscribe(since=k)``
    starts with the kept items numbered ``k`` and later (``seq``), so a client that
    connects late, or reconnects with SSE's ``Last-Event-ID``, sees what it missed.

    Args:
        buffer_size: Items each subscriber may have waiting (default per subscriber).
        on_overflow: ``"drop_oldest"`` (default), ``"latest"`` (drop what a newer item makes
            stale first: see :class:`Subscription`) or ``"disconnect"``.
        events: The events to publish: an iterable of :class:`~trainbus.Event` (or their
            values), ``"all"``, or ``None`` for :data:`DEFAULT_STREAM_EVENTS`.
        metrics: Whether to publish logged metrics and hyperparameters.
        history: Items kept for subscribers that ask for the past (``since=``).

    Example:
        >>> stream = EventStream(events=[Event.EPOCH_END, Event.FIT_END])
        >>> trainer = Trainer(model, loader, "3ep", loss_fn=F.cross_entropy, loggers=[stream])
        >>> async for item in stream.subscribe():    # in a task next to `await trainer.fit()`
        ...     print(item.to_json())
    """

    rank_zero_only = True  # under torchrun: rank 0 only (docs/distributed.md)
    trailing: int | None = 2  # only snapshots and records (docs/concurrency.md, Trailing)

    def __init__(
        self,
        *,
        buffer_size: int = 256,
        on_overflow: OverflowPolicy = "drop_oldest",
        events: Iterable[Event | str] | str | None = None,
        metrics: bool = True,
        history: int = 0,
    ) -> None:
        if isinstance(history, bool) or not isinstance(history, int) or history < 0:
            raise ValueError(f"history={history!r} must be an int >= 0 (items kept), e.g. 512")
        self.buffer_size = _check_buffer_size(buffer_size)
        self.on_overflow = _check_policy(on_overflow)
        self.events = _resolve_events(events)
        if self.events & LIVE_TENSOR_EVENTS:
            # Trailing handlers of these events are refused (issue 54): the stream's
            # handlers then keep the trainer's lag, and finish before the next compute.
            self.trailing = None
        self.metrics = bool(metrics)
        self._subscribers: dict[Subscription, None] = {}  # insertion-ordered set
        self._ended = False
        self._seq = 0
        self._dropped_gone = 0  # drops of subscribers that already left
        self._disconnected = 0
        self._history: deque[_Numbered] = deque(maxlen=history)
        self._cycle_start = 0  # seq of the first item of the current run
        self._feed: BusFeed | None = None
        self._feed_interval = 0.5
        self._feed_next = 0.0
        self._feed_final = False
        # Handlers are attached to the instance, only for the events it publishes (and
        # INIT and FIT_START, which reopen a closed stream), so the bus queues nothing else.
        for event in self.events | _REOPEN:
            setattr(self, event.value, self._event_handler(event, event in self.events))

    def _event_handler(self, event: Event, publish: bool) -> Any:
        async def handler(state: State, logger: Logger) -> None:
            if self._ended and event in _REOPEN:  # a new fit() cycle, or a new trainer
                self._reopen()
            if self._feed is not None:
                self._feed_tick(final=event is Event.FIT_END)
            if publish:
                self._publish(StreamEvent(event, state.timestamp, time.time(), self._seq))

        handler.__qualname__ = f"EventStream.{event.value}"
        return handler

    def _reopen(self) -> None:
        self._ended = False
        self._history.clear()
        self._cycle_start = self._seq
        self._feed_final = False

    # -- bus snapshots ----------------------------------------------------------------------

    def watch(
        self, engine: Engine, *, snapshot_seconds: float = 0.5, interval: float | None = None
    ) -> None:
        """Also publish the bus's statistics and timeline, every ``snapshot_seconds``.

        From now on the stream's handlers publish a :class:`StreamBusSnapshot` of
        ``engine`` (``trainer.engine``) at most every ``snapshot_seconds`` of the run, and
        a last one at ``FIT_END`` (or at ``close`` after an error or a cancellation). It
        starts recording the engine's timeline (``engine.record_trace()``) and keeps only
        its latest spans. The snapshots are taken on the event loop, never on the
        training thread. Call it before ``fit()``.

        Args:
            engine: The trainer's engine.
            snapshot_seconds: Seconds between snapshots (> 0), e.g. 0.5.
            interval: Deprecated name of ``snapshot_seconds`` (warns once).

        Example:
            >>> stream = EventStream(history=1024)
            >>> trainer = Trainer(model, loader, "2ep", loggers=[stream])
            >>> stream.watch(trainer.engine)
        """
        interval = renamed_option(
            "EventStream.watch", "interval", interval, "snapshot_seconds", snapshot_seconds,
            default=0.5,
        )
        if isinstance(interval, bool) or not isinstance(interval, int | float) or not (
            interval > 0
        ):
            raise ValueError(
                f"snapshot_seconds={interval!r} must be a number of seconds > 0, e.g. 0.5"
            )
        from trainbus.callbacks._bus_feed import BusFeed

        self._feed = BusFeed(engine)
        self._feed_interval = float(interval)
        self._feed_next = time.monotonic() + self._feed_interval

    def _feed_tick(self, *, final: bool = False) -> None:
        if self._feed_final:  # the run's last snapshot is out: none after it, timer or not
            return
        now = time.monotonic()
        if final or now >= self._feed_next:
            self._feed_next = now + self._feed_interval
            self._feed_final = final
            self.publish_snapshot()

    def publish_snapshot(self) -> StreamBusSnapshot | None:
        """Publish a bus snapshot now (needs :meth:`watch`); returns it, numbered."""
        if self._feed is None:
            return None
        return self.publish(self._feed.snapshot())

    def publish(self, item: _ItemT) -> _ItemT:
        """Publish an item made elsewhere; the stream numbers it (its ``seq``).

        For feeding a stream from another source, such as a trainer whose events arrive
        from another event loop (the :class:`~trainbus.callbacks.Dashboard` does this).
        Call it on the loop the subscribers iterate on. An ``INIT`` or ``FIT_START`` event
        reopens a stream that has ended.

        Returns:
            The published item, with its ``seq``.
        """
        if not isinstance(item, StreamEvent | StreamMetrics | StreamBusSnapshot):
            raise TypeError(
                f"publish() takes a StreamEvent, StreamMetrics or StreamBusSnapshot, got "
                f"{type(item).__qualname__}"
            )
        if self._ended and isinstance(item, StreamEvent) and item.event in _REOPEN:
            self._reopen()
        numbered = dataclasses.replace(item, seq=self._seq)
        self._publish(numbered)
        return numbered

    # -- subscribers ------------------------------------------------------------------------

    def subscribe(
        self,
        *,
        buffer_size: int | None = None,
        on_overflow: OverflowPolicy | None = None,
        since: int | None = None,
    ) -> Subscription:
        """A new subscription receiving every item published from now on.

        Args:
            buffer_size: This subscriber's buffer (default: the stream's).
            on_overflow: This subscriber's policy (default: the stream's).
            since: Start with the kept history from item number ``since`` on (``0``:
                all of it); items no longer kept (or beyond the buffer) are reported by
                a :class:`StreamGap` first. ``None``: only new items.

        Returns:
            An async iterator (and async context manager) of :data:`StreamItem`. If the
            run has closed it yields only the kept history asked for with ``since=``,
            then ends.
        """
        size = self.buffer_size if buffer_size is None else _check_buffer_size(buffer_size)
        policy = self.on_overflow if on_overflow is None else _check_policy(on_overflow)
        if self._ended:  # the run closed: replay what is kept (since=), then end
            done = Subscription(None, size, policy)
            if since is not None:
                self._replay(done, since)
            return done
        sub = Subscription(self._unsubscribe, size, policy)
        if since is not None:
            self._replay(sub, since)
        self._subscribers[sub] = None
        return sub

    def _replay(self, sub: Subscription, since: int) -> None:
        if isinstance(since, bool) or not isinstance(since, int) or since < 0:
            raise ValueError(f"since={since!r} must be None or an item number >= 0")
        kept = [item for item in self._history if item.seq >= since]
        first = kept[0].seq if kept else self._seq
        missed = max(0, first - max(since, self._cycle_start))  # earlier runs don't count
        if len(kept) > sub._size:
            missed += len(kept) - sub._size
            kept = kept[len(kept) - sub._size :]
        sub._buffer.extend(kept)
        sub._missed = missed
        sub.dropped = missed

    def _unsubscribe(self, sub: Subscription) -> None:
        if self._subscribers.pop(sub, 0) is None:
            self._dropped_gone += sub.dropped

    def _publish(self, item: _Numbered) -> None:
        self._seq += 1
        self._history.append(item)
        gone: list[Subscription] = []
        for sub in self._subscribers:
            if not sub._push(item):
                gone.append(sub)
        for sub in gone:
            self._disconnected += 1
            self._unsubscribe(sub)

    def end(self) -> None:
        """End every subscription (after its buffered items); new ones end at once.

        The ``close`` handler calls this; call it yourself for a run that never started.
        """
        self._ended = True
        subs = list(self._subscribers)
        for sub in subs:
            self._unsubscribe(sub)
            sub._end()

    @property
    def ended(self) -> bool:
        """Whether the run has closed (until the next ``FIT_START``)."""
        return self._ended

    def statistics(self) -> StreamStatistics:
        """Subscribers, items published and items dropped so far."""
        live = sum(sub.dropped for sub in self._subscribers)
        return StreamStatistics(
            subscribers=len(self._subscribers),
            published=self._seq,
            dropped=self._dropped_gone + live,
            disconnected=self._disconnected,
            ended=self._ended,
        )

    # -- handlers ---------------------------------------------------------------------------

    async def log_record(self, record: LogRecord) -> None:
        """Publish a logged record as a :class:`StreamMetrics`."""
        if not self.metrics:
            return
        values = MappingProxyType({k: json_ready(v) for k, v in record.metrics.items()})
        self._publish(
            StreamMetrics(values, record.step, record.wall_time, self._seq, record.hyperparameters)
        )

    async def close(self, state: State, logger: Logger) -> None:
        """End every subscription: the run is over."""
        if self._feed is not None and not self._ended:
            # A run stopped before FIT_END: its last snapshot. After FIT_END's, nothing: the
            # last snapshot comes before ``fit_end`` however long the other closes took.
            self._feed_tick(final=True)
        self.end()
