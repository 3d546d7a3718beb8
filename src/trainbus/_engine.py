"""The engine: the user-facing bridge between plain code, the training thread and the loop.

``Engine.run_event`` is Composer's entry point. Called on the training thread during
``fit()`` it publishes; called from plain synchronous code with no loop running (the
seed's doctests) it starts a loop, runs the handlers and returns when they are done;
called from an event loop's thread it refuses, because waiting there for handlers that
need that same loop would deadlock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import anyio

from trainbus._bridge import no_running_loop
from trainbus._bus import DEFAULT_INLINE_MAX, EventBus
from trainbus._events import Event
from trainbus._exceptions import EngineThreadError, FitInProgressError
from trainbus._statistics import BusStatistics
from trainbus._trace import TraceRecorder

if TYPE_CHECKING:
    from trainbus._logger import Logger
    from trainbus._state import State

__all__ = ["Engine"]


def raise_errors(errors: Sequence[BaseException], what: str = "handlers") -> None:
    """Raise nothing, the one error as it is, or an ``ExceptionGroup`` of several."""
    if not errors:
        return
    if len(errors) == 1:
        raise errors[0]
    if all(isinstance(e, Exception) for e in errors):
        raise ExceptionGroup(f"{len(errors)} {what} failed", list(errors))  # type: ignore[type-var]
    raise BaseExceptionGroup(f"{len(errors)} {what} failed", list(errors))


class Engine:
    """Runs callbacks' handlers for the events of one state.

    Args:
        state: The training state handlers read.
        logger: The logger handlers write to.
        callbacks: The callbacks (loggers last), in the order they are offered events.
        barriers: Events at which the training thread waits for all earlier handlers.
        max_lag: Batches by which handlers may trail the ``BATCH_END`` barrier.
        queue_size: Handler calls that may wait per callback before the producer waits.
        inline_max: Seconds; plain handlers measured this fast run on the training thread
            (0 turns this off, so every plain handler runs on its callback's thread).
        warn_slow: Whether to warn when a callback is slower than the batches.

    Example:
        >>> trainer.engine.run_event(Event.EPOCH_START)   # from plain code: runs handlers
        Epoch: 0
        >>> trainer.engine.close()
    """

    def __init__(
        self,
        state: State,
        logger: Logger,
        callbacks: Sequence[object],
        *,
        barriers: Iterable[Event | str] = (Event.BATCH_END,),
        max_lag: int = 0,
        queue_size: int = 128,
        inline_max: float = DEFAULT_INLINE_MAX,
        warn_slow: bool = True,
    ) -> None:
        self.state = state
        self.logger = logger
        self._bus = EventBus(
            state,
            logger,
            callbacks,
            barriers=[Event(b) for b in barriers],
            max_lag=max_lag,
            queue_size=queue_size,
            inline_max=inline_max,
            warn_slow=warn_slow,
        )
        self._running = False
        self._closed = True

    @property
    def running(self) -> bool:
        """Whether a ``fit()`` (or another engine call) is running handlers now."""
        return self._running

    @property
    def closed(self) -> bool:
        """Whether every callback's ``close`` has run since the last event."""
        return self._closed

    # -- publishing -------------------------------------------------------------------------

    def run_event(self, event: Event | str) -> None:
        """Publish ``event`` (training thread), or run its handlers (plain code).

        Raises:
            EngineThreadError: Called on an event loop's thread, where waiting for the
                handlers would deadlock (use ``await engine.arun_event(event)``), or
                from a thread other than the training thread while ``fit()`` runs.
        """
        event = Event(event)
        bus = self._bus
        if bus.is_producer():
            bus.publish(event)
            return
        self._refuse_blocking_call("run_event", f"await engine.arun_event(Event.{event.name})")
        anyio.run(self.arun_event, event)

    async def arun_event(self, event: Event | str) -> None:
        """Run the handlers of ``event`` and wait for them, from async code."""
        event = Event(event)
        bus = self._bus

        def produce() -> None:
            bus.publish(event)
            bus.wait_all()

        await self.run_cycle(produce, close=False)

    def _refuse_blocking_call(self, name: str, alternative: str) -> None:
        if self._running:
            raise EngineThreadError(
                f"engine.{name}() was called from a thread that is not the training thread "
                "while fit() is running; only the training loop publishes events during a fit"
            )
        if not no_running_loop():
            raise EngineThreadError(
                f"engine.{name}() blocks until the handlers have run, but it was called on "
                "the event loop's thread, and the handlers need that loop: it would "
                f"deadlock. From async code use `{alternative}` instead."
            )

    # -- cycles -----------------------------------------------------------------------------

    async def run_cycle(self, produce: Callable[[], None], *, close: bool = True) -> None:
        """Run ``produce`` on a training thread with the lanes running on this loop.

        With ``close=True`` this is one ``fit()`` cycle: afterwards every callback's
        ``close`` runs, then every ``post_close`` (also after an error or a
        cancellation). Handler errors are raised once all of that is done: the original
        exception, or an ``ExceptionGroup`` when several failed (D10).

        Raises:
            FitInProgressError: The engine is already running a cycle.
        """
        if self._running:
            raise FitInProgressError(
                "this trainer is already fitting; await the running fit() before starting "
                "another, or create a second Trainer"
            )
        self._running = True
        bus = self._bus
        failure: BaseException | None = None
        close_errors: list[BaseException] = []
        try:
            async with bus.session():
                self._closed = False
                try:
                    await bus.run_producer(produce)
                except BaseException as exc:
                    failure = exc
                if close:
                    with anyio.CancelScope(shield=True):
                        close_errors = await bus.close_callbacks()
                    self._closed = True
        finally:
            self._running = False
        if failure is not None and isinstance(failure, anyio.get_cancelled_exc_class()):
            raise failure
        errors = list(bus.errors)
        if failure is not None:
            errors.append(failure)
        raise_errors(errors + close_errors)

    def close(self) -> None:
        """Run every callback's ``close``, then ``post_close``; a no-op if closed.

        From async code use :meth:`aclose`.
        """
        if self._closed:
            return
        self._refuse_blocking_call("close", "await engine.aclose()")
        anyio.run(self.aclose)

    async def aclose(self) -> None:
        """Async twin of :meth:`close`."""
        if self._closed:
            return
        if self._running:
            raise FitInProgressError("cannot close the engine while fit() is running")
        self._running = True
        try:
            async with self._bus.session():
                errors = await self._bus.close_callbacks()
                self._closed = True
        finally:
            self._running = False
        raise_errors(errors, "close handlers")

    # -- observability ----------------------------------------------------------------------

    def statistics(self) -> BusStatistics:
        """Per-callback handler times, queue depths, lag and producer waits."""
        return self._bus.statistics()

    def record_trace(self) -> TraceRecorder:
        """Start recording a timeline of handler calls and producer waits."""
        recorder = TraceRecorder()
        self._bus.trace = recorder
        return recorder

    def stop(self) -> None:
        """Stop the training thread at its next event (any thread)."""
        self._bus.stop()
