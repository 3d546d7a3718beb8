"""The engine: the bus's entry points, for the Trainer, other training loops and plain code.

An :class:`Engine` resolves its callbacks once (``members.py``) and runs one
:class:`~trainbus.bus.session.Session` per cycle (one ``fit()``); ``run_event`` does what its
caller's thread allows. One event's path through the bus: ``bus/__init__.py``.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from concurrent.futures import Future
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from trainbus.bus.counters import Counters
from trainbus.bus.members import Member
from trainbus.bus.options import (
    DEFAULT_CLOSE_TIMEOUT,
    DEFAULT_LANE_THREADS,
    DEFAULT_WAIT_WARNING,
    BusOptions,
)
from trainbus.bus.session import ABANDON_TIMEOUT, Session
from trainbus.core.bridge import LoopThread, no_running_loop
from trainbus.core.callback import resolve_callback
from trainbus.core.destination import resolve_log_handler
from trainbus.core.events import Event
from trainbus.core.exceptions import (
    CallbackSignatureError,
    EngineThreadError,
    FitInProgressError,
    add_thread_bound_hint,
)
from trainbus.core.renamed import renamed_option
from trainbus.observe.clock import BatchClock
from trainbus.observe.statistics import BusStatistics, CallbackStatistics
from trainbus.observe.trace import TraceRecorder

if TYPE_CHECKING:
    from trainbus.bus.worker import Lane
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["Engine", "raise_errors"]

#: The optional methods that run as tasks on the loop (``async def`` only), and when.
_TASKS = {
    "background": "for the whole fit()",
    "preemption_notice": "as soon as the run is told to stop (docs/preemption.md); a "
    "plain handler can read state.preemption instead",
}
_EXTRA_METHODS = tuple((name, object, 2, f"{name}(self, state, logger)") for name in _TASKS)


def raise_errors(errors: Sequence[BaseException], what: str = "handlers") -> None:
    """Raise nothing, the one error as it is, or an ``ExceptionGroup`` of several."""
    if not errors:
        return
    for error in errors:
        add_thread_bound_hint(error)  # sqlite3's wrong-thread error: where to open it
    if len(errors) == 1:
        raise errors[0]
    raise BaseExceptionGroup(f"{len(errors)} {what} failed", list(errors))  # or ExceptionGroup


class Engine:
    """Runs callbacks' handlers for the events of one state.

    Args:
        state: The training state handlers read.
        logger: The logger handlers write to.
        callbacks: The callbacks (loggers last), in the order they are offered events.
        barriers: Events at which the training thread waits for all earlier handlers.
        max_lag: Batches by which handlers may trail the ``BATCH_END`` barrier.
        queue_size: Handler calls that may wait per callback before the producer waits.
        warn_slow_callbacks: Whether to warn when a callback is slower than the batches.
        warn_slow: Deprecated name of ``warn_slow_callbacks`` (warns once).
        wait_warning: Deprecated name of ``wait_warning_seconds`` (warns once).
        close_timeout: Seconds a close may wait for a callback (:class:`BusOptions`).
        wait_warning_seconds: Seconds a wait for a callback lasts before a warning names it.
        lane_threads: Threads in the pool that runs plain callbacks (:class:`BusOptions`).
        options: The options already validated (what the Trainer passes), instead of the
            keywords above, which must then be left at their defaults.

    Raises:
        TypeError: A callback is not a :class:`~trainbus.Callback`, or an option has the
            wrong type (the message names it and the fix).
        ValueError: An option is out of range, or one callback instance is given twice.
        CallbackSignatureError: A handler cannot be called the way the bus calls it.

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
        warn_slow_callbacks: bool = True,
        close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
        wait_warning_seconds: float = DEFAULT_WAIT_WARNING,
        lane_threads: int = DEFAULT_LANE_THREADS,
        warn_slow: bool | None = None,
        wait_warning: float | None = None,
        options: BusOptions | None = None,
    ) -> None:
        if options is None:
            options = BusOptions.validated(
                barriers=barriers,
                max_lag=max_lag,
                queue_size=queue_size,
                warn_slow=renamed_option(
                    "Engine", "warn_slow", warn_slow, "warn_slow_callbacks",
                    warn_slow_callbacks, default=True,
                ),
                close_timeout=close_timeout,
                wait_warning=renamed_option(
                    "Engine", "wait_warning", wait_warning, "wait_warning_seconds",
                    wait_warning_seconds, default=DEFAULT_WAIT_WARNING,
                ),
                lane_threads=lane_threads,
            )
        elif not isinstance(options, BusOptions):
            raise TypeError(
                f"options={options!r} must be a BusOptions (BusOptions.validated(...)), or "
                "leave it out and pass the options as keywords"
            )
        else:  # then every keyword must be left at its default
            passed = locals()
            given = [
                name
                for name, parameter in inspect.signature(Engine).parameters.items()
                if parameter.kind is parameter.KEYWORD_ONLY
                and name != "options"
                and passed[name] != parameter.default
            ]
            if given:
                raise TypeError(
                    f"Engine(options=..., {', '.join(given)}=...): pass the bus's options "
                    "either as one BusOptions or as keywords, not both"
                )
        self.options = options
        self.state = state
        self.logger = logger
        self._counters = Counters()
        self._members: list[Member] = []
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
            for name, when in _TASKS.items():
                task = table.extra.get(name)
                if task is not None and not task.is_async:
                    raise CallbackSignatureError(
                        f"{task.qualname} must be `async def {name}(self, state, logger)`: "
                        f"it runs as a task on the event loop {when}"
                    )
            self._members.append(Member(table, i, resolve_log_handler(table), options.max_lag))
        # Invariant: only the thread whose loop runs a session writes ``_session``,
        # ``_last_lanes`` and ``_running``; other threads read ``_session`` once, into a local.
        self._session: Session | None = None
        self._last_lanes: list[Lane] | None = None
        self._running = False
        self._closed = True
        # Invariant: plain code swaps ``_standing`` (and writes ``_closed``) under ``_plain``;
        # a cycle takes it with one swap (``_cycle``) before its own session starts.
        self._standing: _Standing | None = None
        self._plain = threading.Lock()
        # A callback that observes the bus (the dashboard) gets a private hook, once.
        for callback in callbacks:
            bind = getattr(callback, "_bind_engine", None)
            if callable(bind):
                bind(self)

    @property
    def running(self) -> bool:
        """Whether a cycle (``fit()``, or another async engine call) is running now."""
        return self._running

    @property
    def closed(self) -> bool:
        """Whether every callback's ``close`` has run since the last event."""
        return self._closed

    # -- publishing -------------------------------------------------------------------------

    def run_event(self, event: Event | str) -> None:
        """Publish ``event`` (training thread), or run its handlers (plain code).

        From plain code with no loop running (doctests, callback unit tests) the handlers run
        on a standing session, kept between calls; :meth:`close` ends it.

        Raises:
            EngineThreadError: Called on an event loop's thread, where waiting for the
                handlers would deadlock (use ``await engine.arun_event(event)``), or
                from a thread other than the training thread while a cycle runs.
        """
        if event.__class__ is not Event:
            event = Event(event)
        session = self._session
        if session is not None and session.producer.is_producer():
            session.producer.publish(event)
            return
        self._refuse_blocking_call("run_event", f"await engine.arun_event(Event.{event.name})")
        with self._plain:
            standing = self._standing = self._standing or _Standing(self)
            self._closed = False
            session = standing.session
            session.as_producer(lambda: session.producer.run_now(event))
            errors = list(session.gate.errors)
            if errors:
                self._standing = None
                standing.end(close=False)
        raise_errors(errors)

    def publisher(self) -> Callable[..., None]:
        """The running cycle's bound ``publish(*events)``, for the training thread's hot
        path (:meth:`run_event` without the check of the calling thread).

        Raises:
            RuntimeError: No cycle is running.
        """
        return self._running_session().producer.publish

    def wait_all(self, *, records: bool = False) -> None:
        """Block the training thread until every handler published so far has finished
        (with ``records``: and every record logged so far reached every destination).

        Raises:
            RuntimeError: No cycle is running.
        """
        self._running_session().producer.wait_all(records=records)

    def _refuse_while_running(self, what: str = "") -> None:
        """Raise :class:`~trainbus.FitInProgressError` while a cycle runs: the one place that
        refuses a second ``fit()`` (or, with ``what``, another call) meanwhile."""
        if not self._running:
            return
        if what:
            raise FitInProgressError(f"cannot {what} while fit() is running")
        raise FitInProgressError(
            "this trainer is already fitting; await the running fit() before starting "
            "another, or create a second Trainer"
        )

    def _running_session(self) -> Session:
        session = self._session
        if session is None:
            raise RuntimeError("the engine has no running cycle (call it from run_cycle)")
        return session

    async def arun_event(self, event: Event | str) -> None:
        """Run the handlers of ``event`` and wait for them, from async code, in a cycle of
        its own (no ``close``), as the Trainer's constructor runs ``INIT``."""
        event = Event(event)

        def produce() -> None:
            self.publisher()(event)
            self.wait_all()

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

    @asynccontextmanager
    async def _session_on_this_loop(self) -> AsyncIterator[Session]:
        if self._session is not None:
            raise EngineThreadError("the engine already has a running session")
        session = Session(
            state=self.state, logger=self.logger, members=self._members,
            options=self.options, counters=self._counters,
        )
        self._session = session
        self._last_lanes = session.lanes
        try:
            async with session.running():
                yield session
        finally:
            self._session = None

    @asynccontextmanager
    async def _cycle(self, what: str = "") -> AsyncIterator[Session]:
        """A session on this loop as the running cycle (``running``), the standing one
        ended first."""
        self._refuse_while_running(what)
        self._running = True
        try:
            standing, self._standing = self._standing, None
            if standing is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(standing.end, False)
            async with self._session_on_this_loop() as session:
                yield session
        finally:
            self._running = False

    async def run_cycle(self, produce: Callable[[], None], *, close: bool = True) -> None:
        """Run ``produce`` (the training loop, publishing with :meth:`run_event` or
        :meth:`publisher`) on a new training thread, the handlers on this loop.

        With ``close=True`` this is one ``fit()`` cycle: afterwards every ``close`` runs, then
        every ``post_close`` (also after an error or a cancellation); then the handlers'
        errors are raised (:func:`raise_errors`, D10).

        Raises:
            FitInProgressError: The engine is already running a cycle.
        """
        failure: BaseException | None = None
        close_errors: list[BaseException] = []
        async with self._cycle() as session:
            self._closed = False
            try:
                await session.run_producer(produce)
            except BaseException as exc:
                failure = exc
            if close:
                with anyio.CancelScope(shield=True):
                    close_errors = await session.close_callbacks()
                self._closed = True
        errors = list(session.gate.errors)
        if isinstance(failure, anyio.get_cancelled_exc_class()):
            raise failure
        if failure is None:  # a cancellation that came during the (shielded) close
            await anyio.lowlevel.checkpoint_if_cancelled()
        else:
            errors.append(failure)
        raise_errors(errors + close_errors)

    def close(self) -> None:
        """Run every callback's ``close``, then ``post_close``; a no-op if closed (from
        async code use :meth:`aclose`)."""
        if self._closed:
            return
        self._refuse_blocking_call("close", "await engine.aclose()")
        with self._plain:
            standing, self._standing = self._standing, None
            if standing is not None:
                errors = standing.end(close=True)
                self._closed = True
                raise_errors(errors, "close handlers")
                return
        anyio.run(self.aclose)  # no standing session: after arun_event, or a failed event

    async def aclose(self) -> None:
        """Async twin of :meth:`close`."""
        if self._closed:
            return
        async with self._cycle("close the engine") as session:
            errors = await session.close_callbacks()
            self._closed = True
        raise_errors(errors, "close handlers")

    # -- observability ----------------------------------------------------------------------

    def statistics(self) -> BusStatistics:
        """Per-callback handler times, queue depths, lag and producer waits."""
        return _collect_statistics(
            self._members, self._last_lanes, self._counters, self.state._timer._ts._batch
        )

    def training_thread_handler(self) -> str | None:
        """``"Class.method"`` of the ``@blocking`` handler the training thread runs now, or
        ``None`` (any thread; a read of what the training thread last wrote, so it may be a
        moment old). A health check uses it to tell a checkpoint's capture from a hang."""
        session = self._session
        lane = session.producer.running_here if session is not None else None
        return lane.current if lane is not None else None

    def batch_clock(self) -> BatchClock:
        """The engine's :class:`~trainbus.observe.clock.BatchClock`, started at
        the first call; every caller gets the same clock."""
        clock = self._counters.clock
        if clock is None:
            clock = self._counters.clock = BatchClock()
        return clock

    def record_trace(self, max_spans: int | None = None) -> TraceRecorder:
        """Start recording a timeline of handler calls and producer waits.

        Args:
            max_spans: As :class:`TraceRecorder`'s (a live view reads :meth:`TraceRecorder.drain`).
        """
        recorder = TraceRecorder(max_spans)
        self._counters.trace = recorder
        return recorder

    def stop(self) -> None:
        """Stop the training thread at its next event (any thread)."""
        session = self._session
        if session is not None:
            session.stop()

    # -- Ctrl-C and preemption (``runtime/``; safe from a signal handler) --------------------

    def _describe_waiting(self) -> str:
        session = self._session
        return session.describe_waiting() if session is not None else ""

    def _callbacks(self) -> list[Any]:
        """The callbacks this engine runs (on this rank), in order."""
        return [member.table.callback for member in self._members]

    def _training_thread_held(self) -> bool:
        """Whether the training thread waits for handlers right now (at a barrier, for
        room in a queue, for a ``@blocking`` handler's turn): any thread."""
        session = self._session
        return session is not None and bool(session.gate._waiting)  # the gate's invariant

    def _interrupt(self, cancel: Callable[[], None]) -> None:
        self.stop()
        cancel()

    def _notify_preemption(self) -> None:
        """Start every ``async def preemption_notice`` on the loop (any thread, signal-safe);
        outside a session, the next one starts them (``Session._run_backgrounds``)."""
        session = self._session
        if session is not None:
            session.loop.call_soon_if_running(session.notify_preemption)

    def _abandon(self, why: str = "the second Ctrl-C", timeout: float = ABANDON_TIMEOUT) -> None:
        session = self._session
        if session is not None:
            session.loop.call_soon(session.abandon, why, timeout)


class _Standing:
    """A session held open by a task (``_hold``) on a loop thread of its own, for calls
    from plain code, until :meth:`end`.

    Invariant: ``_hold`` resolves ``_opened`` once, on the loop thread (with the session and
    the event that ends it, or the failure to open it); the calling threads read it.
    """

    def __init__(self, engine: Engine) -> None:
        self._thread = LoopThread("trainbus-engine-loop")
        self._opened: Future[tuple[Session, anyio.Event]] = Future()
        self._ended = threading.Event()
        self._thread.start_soon(self._hold, engine)
        try:
            self.session, self._end = self._opened.result()
        except BaseException:
            self._thread.stop()
            raise

    async def _hold(self, engine: Engine) -> None:
        try:
            async with engine._session_on_this_loop() as session:
                end = anyio.Event()
                self._opened.set_result((session, end))
                await end.wait()
        except BaseException as exc:
            if not self._opened.done():
                self._opened.set_exception(exc)
        finally:
            self._ended.set()

    def end(self, close: bool) -> list[BaseException]:
        """End the session (after every ``close``/``post_close`` if ``close``); return the
        errors of those."""
        errors = self._thread.call(self.session.close_callbacks) if close else []
        assert self._thread.loop is not None
        self._thread.loop.call_soon(self._end.set)
        self._ended.wait()
        self._thread.stop()
        return errors


def _collect_statistics(members: Sequence[Member], lanes: Sequence[Lane] | None,
                       counters: Counters, now_batch: int) -> BusStatistics:
    """Read the counters into a :class:`BusStatistics` (any thread, no lock: each count is
    its writer's latest, not all from one instant); ``lanes``: the running or last session's."""
    per_callback = []
    depth = 0
    for member in members:
        lane = lanes[member.index] if lanes else None
        pending = records = lag = 0
        member_peak = member.peak
        if lane is not None:
            queue = lane.worker.queue
            pending = queue.enq - queue.done
            member_peak = max(member.peak, queue.peak)
            box = lane.mailbox
            records = box.depth if box is not None else lane.records.enq - lane.records.done
            if pending:
                lag = max(now_batch - queue.last_batch, 0)
            if lane.worker.lanes[0] is lane:  # a queue callbacks share counts once
                depth += pending
        slots = member.all_slots()
        here = [s for s in slots if s.here]  # plain @blocking: run by the training thread
        slowest = max(slots, key=lambda s: s.max_time, default=None)
        per_callback.append(
            CallbackStatistics(
                name=member.name,
                handled=sum(s.calls for s in slots),
                inline=sum(s.calls for s in here),
                total_time=sum(s.total_time for s in slots),
                max_time=max((s.max_time for s in slots), default=0.0),
                slowest=slowest.handler.qualname if slowest and slowest.calls else None,
                pending=pending,
                peak_pending=member_peak,
                on_thread=member.on_thread,
                pending_records=records,
                peak_pending_records=member.peak_records,
                lag_batches=lag,
                barrier_wait_caused=member.wait_caused,
                records_dropped=member.records_dropped,
                records_coalesced=member.records_coalesced,
                values_dropped=member.values_dropped,
                slow=member.slow,
                slow_batches=member.slow_batches,
                inline_time=sum(s.total_time for s in here),
            )
        )
    return BusStatistics(
        callbacks=tuple(per_callback),
        events_published=counters.published,
        batches=counters.batches,
        queue_depth=depth,
        peak_queue_depth=max((c.peak_pending for c in per_callback), default=0),
        lag_events=max((c.pending for c in per_callback), default=0),
        lag_batches=max((c.lag_batches for c in per_callback), default=0),
        barrier_waits=counters.barrier_waits,
        barrier_wait_time=counters.barrier_wait,
        backpressure_wait_time=counters.backpressure_wait,
        loop_wakeups=counters.loop_wakeups,
    )
