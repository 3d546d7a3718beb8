"""``EventBus``: the composition root of the bus.

It resolves the callbacks once (their :class:`~trainbus.bus._slot.Member` records keep
statistics and the inline verdicts for the engine's lifetime), builds a fresh
:class:`~trainbus.bus._session.Session` for every run, and forwards the training thread's
``publish`` to the running session's producer. See ``docs/concurrency.md`` for the model
(guarantees D1-D14) and each module's docstring for its part:

- ``_options``: the options and their validation;
- ``_items``, ``_slot``, ``_lane``: work items, handlers, per-session queues and who runs them;
- ``_gate``: what the producer waits for, failures, stopping;
- ``_producer``: publishing, barriers, lags, backpressure (training thread);
- ``_inline``: the inline fast path (its one policy);
- ``_threads``, ``_dispatcher``: the two lane drivers (a thread, the event loop);
- ``_bridge``: every crossing from a thread into the event loop;
- ``_session``: a run's lifecycle, close and its deadlines;
- ``_statistics``, ``_slow``, ``_trace``: observation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from trainbus.bus._options import BusOptions
from trainbus.bus._session import Session
from trainbus.bus._slot import Member
from trainbus.bus._statistics import BusStatistics, Counters, collect_statistics
from trainbus.bus._stopped import Stopped
from trainbus.core.callback import resolve_callback
from trainbus.core.events import Event
from trainbus.core.exceptions import CallbackSignatureError, EngineThreadError
from trainbus.core.logger import resolve_log_handler

if TYPE_CHECKING:
    from trainbus.bus._lane import Lane
    from trainbus.bus._trace import TraceRecorder
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["EventBus", "Stopped"]

_EXTRA_METHODS = (("background", object, 2, "background(self, state, logger)"),)


class EventBus:
    """Carries events from one producer thread to the callbacks' lanes on the loop.

    Args:
        state: The live state; each publication captures a snapshot of it.
        logger: The root logger; its records are routed to destination lanes.
        callbacks: Callbacks, in the order they are offered events.
        options: Validated options (:meth:`BusOptions.validated`).

    Raises:
        TypeError: A callback is not a :class:`~trainbus.Callback`.
        ValueError: The same callback instance is registered twice.
        CallbackSignatureError: A handler cannot be called the way the bus calls it.
    """

    def __init__(
        self,
        state: State,
        logger: Logger,
        callbacks: Sequence[object],
        options: BusOptions | None = None,
    ) -> None:
        self.state = state
        self.logger = logger
        self.options = options = options or BusOptions()
        self.counters = Counters()
        self.members: list[Member] = []
        seen: dict[int, int] = {}
        for i, cb in enumerate(callbacks):
            if id(cb) in seen:
                raise ValueError(
                    f"callbacks[{i}] is the same {type(cb).__qualname__} instance as "
                    f"callbacks[{seen[id(cb)]}]; each callback is registered once (create "
                    "a second instance to run it twice)"
                )
            seen[id(cb)] = i
            table = resolve_callback(cb, where=f"callbacks[{i}]", extra=_EXTRA_METHODS)
            background = table.extra.get("background")
            if background is not None and not background.is_async:
                raise CallbackSignatureError(
                    f"{background.qualname} must be `async def background(self, state, "
                    "logger)`: it runs as a task on the event loop for the whole fit()"
                )
            self.members.append(Member(table, i, resolve_log_handler(table), options.max_lag))
        self._session: Session | None = None
        self._last_lanes: list[Lane] | None = None

    @property
    def trace(self) -> TraceRecorder | None:
        """The timeline recorder, while one records."""
        return self.counters.trace

    @trace.setter
    def trace(self, recorder: TraceRecorder | None) -> None:
        self.counters.trace = recorder

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        """Run the lanes on the current loop for the duration of the block."""
        if self._session is not None:
            raise EngineThreadError("the bus already has a running session")
        session = Session(
            state=self.state,
            logger=self.logger,
            members=self.members,
            options=self.options,
            counters=self.counters,
        )
        self._session = session
        self._last_lanes = session.lanes
        try:
            async with session.running():
                yield session
        finally:
            self._session = None

    def _running(self) -> Session:
        session = self._session
        if session is None:
            raise RuntimeError("the bus has no running session")
        return session

    def publish(self, *events: Event) -> None:
        """Offer events to the callbacks (the producer thread of a running session).

        Raises:
            Stopped: The session is stopping; the producer should unwind.
        """
        self._running().producer.publish(*events)

    def publisher(self) -> Callable[..., None]:
        """The running session's :meth:`publish`, bound: the training loop's hot path."""
        return self._running().producer.publish

    def wait_all(self, *, records: bool = False) -> None:
        """Block the producer until every handler published so far has finished (and,
        with ``records``, every record logged so far reached every destination)."""
        self._running().producer.wait_all(records=records)

    def is_producer(self) -> bool:
        """Whether the calling thread is the running session's producer thread."""
        session = self._session
        return session is not None and session.producer.is_producer()

    def stop(self) -> None:
        """Stop the running session's producer at its next event (any thread)."""
        session = self._session
        if session is not None:
            session.stop()

    def statistics(self) -> BusStatistics:
        """A snapshot of per-callback timings, queue depths, lag and producer waits."""
        return collect_statistics(
            self.members, self._last_lanes, self.counters, self.state._timer._ts._batch
        )



