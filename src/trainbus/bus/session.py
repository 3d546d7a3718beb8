"""A session: one run of the bus on one event loop (one ``fit()``, or one engine call from
plain code), from its start to its close.

It builds the per-run parts: the gate, a lane per callback, the workers (``worker.place``),
the producer; what outlives it (statistics, counters) lives in the engine's members::

    running():          start the lane threads, then the loop tasks (workers, backgrounds)
      run_producer(fn):   fn on a new training thread, publishing; cancellable
      close_callbacks():  drain; every close (destinations last); every post_close
    (exit)              drain, stop the workers, wait for them

Its tasks run in a task group under a shielded scope: a task started while the caller is
being cancelled must still start (a thread's handed-over coroutine), or that thread would
wait for it for ever. Every wait on user code is bounded (``close_timeout``, cut short by
:meth:`Session.abandon`); ``docs/concurrency.md``, "Close", says what happens past it.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

import anyio

from trainbus.bus.producer import Producer
from trainbus.bus.queue import STOP, CallItem, Gate
from trainbus.bus.records import Records
from trainbus.bus.slow import long_wait_message
from trainbus.bus.watchdog import LoopWatch
from trainbus.bus.worker import Lane, Worker, place
from trainbus.core.bridge import LoopHandle, Spawner
from trainbus.core.exceptions import (
    CallbackTimeoutWarning,
    LaneThreadError,
    RecordsDroppedWarning,
    SlowCallbackWarning,
    Stopped,
)
from trainbus.core.threads import run_in_thread, start_thread
from trainbus.core.warn_at import report_at, warn_at

if TYPE_CHECKING:
    from trainbus.bus.counters import Counters
    from trainbus.bus.members import Member
    from trainbus.bus.options import BusOptions
    from trainbus.bus.queue import Counted, WaitKind
    from trainbus.core.callback import Handler
    from trainbus.core.events import Event
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["ABANDON_TIMEOUT", "OWN_TIMEOUT_MARGIN", "Session"]

#: Seconds each callback still gets to close after a second Ctrl-C (``abandon``).
ABANDON_TIMEOUT = 2.0
#: Seconds added to a callback's own ``close_timeout`` (its retries) before it is abandoned.
OWN_TIMEOUT_MARGIN = 5.0


class Session:
    """The per-run parts of the bus (create it on the loop; see the module docstring)."""

    def __init__(
        self,
        *,
        state: State,
        logger: Logger,
        members: Sequence[Member],
        options: BusOptions,
        counters: Counters,
    ) -> None:
        # Invariant: every attribute is set once, here; the loop thread alone touches the
        # four last ones (``abandon`` and ``notify_preemption`` come by ``call_soon``).
        self.state = state
        self.logger = logger
        self.options = options
        self.loop = LoopHandle()
        self.gate = gate = Gate(counters)
        gate.wait_warning = options.wait_warning
        gate.on_long_wait = self._warn_long_wait
        self.lanes = [Lane(member, gate, options.queue_size) for member in members]
        self.spawner = Spawner(self.loop)
        #: The workers, each with the callbacks pinned to it (``worker.place``).
        self.workers = place(
            self.lanes, options.lane_threads, gate, counters, self.loop, self.spawner,
            options.queue_size,
        )
        self.threads = [worker for worker in self.workers if worker.on_thread]
        self.watch = LoopWatch(self.loop, self.lanes)  # deadlines a held loop cannot keep
        self.producer = Producer(
            state=state, logger=logger, members=members, lanes=self.lanes,
            workers=self.workers, options=options, gate=gate, counters=counters,
            call_soon=self.loop.call_soon, warn=self._warn_slow,
        )
        self.records = Records(
            self.lanes, gate, counters, self.loop.call_soon, self.loop.thread_id, self.producer
        )
        #: Scopes of the waits that close_timeout bounds; a second Ctrl-C shortens them.
        self._bounded: set[anyio.CancelScope] = set()
        self._abandoning = ""  # why every bounded wait was cut short, once it was
        self._abandon_timeout = ABANDON_TIMEOUT  # and how long each got then
        self._noticed = anyio.Event()  # state.preemption is set: start preemption_notice

    # -- lifecycle -------------------------------------------------------------------------

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Session]:
        """Run the lanes on the current loop for the block; on exit they finish what is
        queued (event handlers skipped once stopped, records delivered) within
        ``close_timeout``, then end: only a lane thread abandoned in a plain handler outlives it.

        Raises:
            LaneThreadError: The operating system refused to start a lane thread (the
                ones already started are stopped first).
            ThreadStartError: It refused the watch thread of the close's deadlines
                (``bus/watchdog.py``): raised once every callback has closed without it.
        """
        finished = {worker: anyio.Event() for worker in self.workers}
        try:  # before the task group, so that a refusal is raised as it is, not grouped
            for worker in self.threads:
                worker.thread = self._start(
                    worker.name, self._thread_main, worker, finished[worker]
                )
        except LaneThreadError:
            with anyio.CancelScope(shield=True):
                for worker in self.threads:
                    if worker.thread is not None:
                        worker.put(STOP)
                        await finished[worker].wait()
            raise
        internal = anyio.CancelScope(shield=True)
        background = anyio.CancelScope()
        async with anyio.create_task_group() as outer:
            # Shielded: a caller cancelled now still gets the whole start, then the close.
            # Started, not only scheduled: the session runs before the training thread does.
            with anyio.CancelScope(shield=True):
                tg = await outer.start(_run_internal, internal)
                for worker in self.workers:
                    if not worker.on_thread:
                        tg.start_soon(worker.run_task, finished[worker], name=worker.name)
                await tg.start(self.spawner.serve, tg)
                await tg.start(self._run_backgrounds, background)
            self.logger._connect(self.records.submit)
            try:
                yield self
            finally:
                with anyio.CancelScope(shield=True):
                    await self.drain()
                    await self.disconnect_logger()
                    background.cancel()
                    for worker in self.workers:
                        worker.put(STOP)
                    for worker in self.workers:  # an abandoned lane's worker is left behind
                        if not any(lane.abandoned for lane in worker.lanes):
                            await finished[worker].wait()
                            if worker.thread is not None:
                                worker.thread.join()
                    internal.cancel()
                    for lane in self.lanes:  # the queue's peak outlives the session
                        lane.member.peak = max(lane.member.peak, lane.worker.queue.peak)
        if self.watch.refused is not None:  # every callback closed unwatched: now say so
            raise self.watch.refused

    def _start(self, name: str, target: Callable[..., None], *args: Any) -> threading.Thread:
        """Start a daemon thread, or raise :class:`LaneThreadError` naming what the fit needs."""
        return start_thread(
            threading.Thread(target=target, args=args, name=name, daemon=True),
            needed=f"This fit needs {len(self.threads) + 1} threads of the bus: lower "
            "Trainer(lane_threads=...) (the pool of threads plain callbacks share; callbacks "
            "that set own_thread = True add one each)",
            error=LaneThreadError,
        )

    def _thread_main(self, worker: Worker, finished: anyio.Event) -> None:
        try:
            worker.run_thread()
        except BaseException as exc:  # a bug of ours: fail the run rather than hang it
            self.gate.fail(exc, None, None)
            worker.drain_failed(exc)
        finally:
            self.loop.call_soon_if_running(finished.set)

    async def _run_backgrounds(
        self,
        scope: anyio.CancelScope,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Start every ``background`` (each up to its first wait), report started, then
        every ``preemption_notice`` once the run is told to stop."""
        with scope:
            async with anyio.create_task_group() as tg:
                for name in ("background", "preemption_notice"):
                    if name == "preemption_notice":
                        task_status.started()
                        if self.state.preemption is None:
                            await self._noticed.wait()  # (else given before this session)
                    for lane in self.lanes:
                        handler = lane.member.table.extra.get(name)
                        if handler is not None:
                            await tg.start(self._background, handler)

    def notify_preemption(self) -> None:
        """Start each callback's ``preemption_notice`` once (loop): like ``background``, a
        task of its own beside its lane, cancelled after every ``close``; an exception in it
        fails the run as a handler's would."""
        self._noticed.set()

    async def _background(
        self,
        handler: Handler,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        task_status.started()
        try:
            await handler.fn(self.state, self.logger)
        except Exception as exc:
            self.gate.fail(exc, handler, None)

    # -- the training thread ---------------------------------------------------------------

    def as_producer(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on this thread as the session's producer; a stop ends it quietly."""
        producer = self.producer
        producer.ident = threading.get_ident()
        try:
            fn()
        except Stopped:  # the session stopped it (a failed handler's error is in the gate)
            pass
        finally:
            producer.hand_over()  # what a stop left in the inboxes: counted, then run
            producer.ident = None

    async def run_producer(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on a new training thread and wait for it, cancellably.

        If the waiting task is cancelled, the session stops, the thread unwinds at its next
        event, and the cancellation propagates once the thread has ended (D11), or once
        ``close_timeout`` has passed (then the thread is reported and left behind).
        Exceptions from ``fn`` other than :class:`Stopped` are re-raised here.
        """
        finished = anyio.Event()
        box: list[BaseException] = []

        def main() -> None:
            try:
                self.as_producer(fn)
            except BaseException as exc:
                box.append(exc)
            finally:
                self.loop.call_soon_if_running(finished.set)

        thread = self._start("trainbus-train", main)
        try:
            await finished.wait()
        except BaseException:
            self.stop()
            for lane in self.lanes:  # cancel the coroutine handlers running now
                if lane.scope is not None:
                    lane.scope.cancel()
            timeout = self.timeout()
            with self._deadline(timeout, shield=True):
                await finished.wait()
            if finished.is_set():
                thread.join()
            else:
                self._warn_stuck("the training thread", "its current step", None, timeout)
            raise
        thread.join()
        if box:
            raise box[0]

    def stop(self) -> None:
        """Stop the training thread at its next event or wait (any thread)."""
        self.gate.stop()

    def abandon(self, why: str = "the second Ctrl-C", timeout: float = ABANDON_TIMEOUT) -> None:
        """A second Ctrl-C (or the preemption watchdog): stop, and give every bounded wait,
        running or to come, at most ``timeout`` more seconds (loop thread); what has not
        finished then is abandoned. Nothing is cut at once: a stuck handler and one about
        to return look alike."""
        self.stop()
        self._abandoning = why
        self._abandon_timeout = timeout
        # Not anyio.current_time(): a call_soon callback runs outside any task (LoopHandle).
        deadline = self.loop.current_time() + timeout
        for scope in self._bounded:
            scope.deadline = min(scope.deadline, deadline)

    def describe_waiting(self) -> str:
        """What runs or waits now, e.g. ``"Upload.batch_end, Metrics"`` (any thread)."""
        busy = []
        for lane in self.lanes:
            current = lane.current
            if current is not None or lane.worker.queue.done < lane.worker.queue.enq:
                busy.append(current or lane.name)
        return ", ".join(busy)

    # -- close -----------------------------------------------------------------------------

    @contextmanager
    def _deadline(self, timeout: float, shield: bool = False) -> Iterator[anyio.CancelScope]:
        """A wait on user code: cut short after ``timeout`` s, or sooner after ``abandon``."""
        with anyio.move_on_after(timeout, shield=shield) as scope:
            self._bounded.add(scope)
            try:
                yield scope
            finally:
                self._bounded.discard(scope)

    def timeout(self, lane: Lane | None = None) -> float:
        """The deadline for ``lane``'s close: ``close_timeout``, or longer when the callback
        has its own ``close_timeout`` (an uploader retrying that long) plus a margin."""
        if self._abandoning:
            return self._abandon_timeout
        timeout = self.options.close_timeout
        own = getattr(lane.member.table.callback, "close_timeout", None) if lane else None
        if isinstance(own, int | float) and not isinstance(own, bool):
            timeout = max(timeout, float(own) + OWN_TIMEOUT_MARGIN)
        return timeout

    async def _bounded_call(
        self, lanes: Sequence[Lane], fn: Callable[[], Any] | None, is_async: bool, what: str
    ) -> None:
        """Run ``fn`` as the next item of the worker of ``lanes`` (a lane, or all of a lane
        thread's: one FIFO) within the longest of their deadlines; if it is missed, abandon
        them all, naming the one running a handler as stuck. Warn after ``wait_warning``."""
        lane = lanes[0]
        timeout = max(map(self.timeout, lanes))
        finished = anyio.Event()
        box: list[BaseException] = []

        def on_done(error: BaseException | None) -> None:
            if error is not None:
                box.append(error)
            finished.set()

        lane.worker.put(CallItem(fn, is_async, on_done, lane, what))
        deadline = f"its close deadline ({timeout:g} s, close_timeout)"
        with self.watch.armed(timeout, deadline), self._deadline(timeout) as scope:
            with anyio.move_on_after(min(self.options.wait_warning, timeout)):
                await finished.wait()
            if not finished.is_set():  # drawn from timings: reported, never raised (D7)
                report_at(
                    f"closing has waited {self.options.wait_warning:g} s for callback "
                    f"{lane.name} ({what or lane.current or 'what it had queued'}); it is "
                    f"abandoned after {timeout:g} s (close_timeout)",
                    CallbackTimeoutWarning,
                    lane.member.table.callback,
                )
                await finished.wait()
        if scope.cancelled_caught:
            stuck = next((each for each in lanes if each.current is not None), lane)
            for each in lanes:
                each.abandoned = each.worker.queue.abandoned = True  # nobody waits for it
                each.records.abandoned = True
            doing = what or stuck.current or "what it had queued"
            if stuck.scope is not None:
                stuck.scope.cancel()
            behind = [each for each in lanes if each is not stuck]
            callback = stuck.member.table.callback
            self._warn_stuck(f"callback {stuck.name}", doing, callback, timeout, behind)
        elif box:
            raise box[0]

    async def drain(self) -> None:
        """Wait until every lane has run everything queued so far (or was abandoned): one
        mark per worker, after all its lanes' items (none for a worker nothing is ever
        queued on: :func:`_queues`)."""
        async with anyio.create_task_group() as tg:
            for worker in self.workers:
                live = [lane for lane in worker.lanes if not lane.abandoned]
                if live and any(map(_queues, live)):
                    tg.start_soon(self._bounded_call, live, None, False, "")

    async def disconnect_logger(self) -> None:
        """Stop taking records (later ones wait in the logger's backlog for the next
        session, ``docs/loggers.md``), after the calls inside the intake now finish, so
        every record taken reaches its destinations before their ``close`` (bounded as a
        close is; a record still inside then may arrive late)."""
        self.logger._disconnect()
        hub = self.logger._hub
        if not hub.inside:
            return
        timeout = self.timeout()
        with self._deadline(timeout):  # cut short, the worker thread ends within ``timeout``
            await run_in_thread(hub.wait_idle, timeout, abandon_on_cancel=True,
                                needed="It waits for the logger's intake at close")  # fmt: skip

    async def close_callbacks(self) -> list[BaseException]:
        """Run every ``close`` (destinations last), then every ``post_close``.

        Each runs on its callback's lane, after what the lane had queued (close is a
        barrier), within its deadline. Returns the exceptions raised, each with a note
        naming its callback; one failing or stuck ``close`` does not stop the others.
        """
        errors: list[BaseException] = []
        await self.drain()

        async def call(lane: Lane, handler: Handler, *args: Any) -> None:
            try:
                await self._bounded_call(
                    [lane], lambda: handler.fn(*args), handler.is_async, handler.qualname
                )
            except BaseException as exc:
                if isinstance(exc, anyio.get_cancelled_exc_class()):
                    raise
                exc.add_note(f"raised by {handler.qualname}")
                errors.append(exc)

        for destinations in (False, True):  # callbacks first, then destinations
            if destinations:  # what is logged from now on waits for the next fit
                await self.disconnect_logger()
            async with anyio.create_task_group() as tg:
                for lane in self.lanes:
                    close = lane.member.table.close
                    is_dest = lane.log_slot is not None
                    if close is not None and is_dest is destinations and not lane.abandoned:
                        tg.start_soon(call, lane, close, self.state, self.logger)
        for lane in self.lanes:  # what lossy destinations lost: nothing more reaches them
            drops = lane.mailbox.report(lane.index) if lane.mailbox is not None else None
            if drops is not None:
                self._emit(drops, RecordsDroppedWarning, lane.member.table.callback)
        async with anyio.create_task_group() as tg:
            for lane in self.lanes:
                post = lane.member.table.post_close
                if post is not None and not lane.abandoned:
                    tg.start_soon(call, lane, post)
        return errors

    # -- warnings --------------------------------------------------------------------------

    def _emit(self, message: str, category: type[Warning], where: object) -> None:
        """Warn on the loop thread, at ``where``'s code; an error-warning fails the run."""
        try:
            warn_at(message, category, where)
        except Warning as exc:
            self.gate.fail(exc, None, None)

    def _warn_stuck(
        self, who: str, what: str, where: object, timeout: float, behind: Sequence[Lane] = ()
    ) -> None:
        if self._abandoning:
            when = f"within {self._abandon_timeout:.1f} s of {self._abandoning}"
        else:
            when = f"within {timeout:g} s (close_timeout)"
        others = "The other callbacks were closed."
        if behind:
            others = (
                f"The other callbacks were closed, but for the {len(behind)} pinned to its "
                "lane thread, whose items wait behind it "
                f"({', '.join(each.name for each in behind)}): give a callback that "
                "blocks for long a thread of its own (own_thread = True)."
            )
        self._emit(
            f"{who} did not finish {what} {when} and was abandoned; a thread stuck in a "
            f"plain handler is left running as a daemon. {others}",
            CallbackTimeoutWarning,
            where,
        )

    def _warn_long_wait(
        self, kind: WaitKind, event: Event | None, waited: list[Counted], seconds: float
    ) -> None:
        """The training thread has waited ``seconds`` for ``waited`` (training thread): name
        the callbacks behind it, in list order: a destination's, or, for a worker's queue,
        those running a handler now (else all its callbacks)."""
        found = {lane for lane in self.lanes if lane.records in waited}
        for worker in self.workers:
            if worker.queue in waited:
                busy = [lane for lane in worker.lanes if lane.current is not None]
                found.update(busy or worker.lanes)
        lanes = sorted(found, key=lambda lane: lane.index)
        where = lanes[0].member.table.callback if lanes else None
        message = long_wait_message(kind, event, lanes, seconds)
        self.loop.call_soon(report_at, message, CallbackTimeoutWarning, where)
        at = f" of Event.{event.name}" if event is not None else ""
        self.watch.check(  # a warning's threshold: named, never interrupted (D7)
            f"the training thread's wait{at} ({seconds:g} s, wait_warning_seconds)", interrupt=False
        )

    def _warn_slow(self, message: str, where: object) -> None:
        """A SlowCallbackWarning, on the loop thread where the caller's filters apply; it
        never fails the run (``core/warn_at.py``)."""
        self.loop.call_soon(report_at, message, SlowCallbackWarning, where)


async def _run_internal(
    scope: anyio.CancelScope,
    *,
    task_status: anyio.abc.TaskStatus[anyio.abc.TaskGroup] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve a task group under ``scope`` (shielded) until it is cancelled."""
    with scope:
        async with anyio.create_task_group() as tg:
            task_status.started(tg)
            await anyio.sleep_forever()


def _queues(lane: Lane) -> bool:
    """Whether anything can be queued on ``lane``'s worker before its close: a handler
    that is not a plain ``@blocking`` one (those run on the publishing thread), or
    records. A worker none of whose lanes can has nothing to drain (a rule of the
    declarations, never of what is queued now): no bounded wait, so no watch thread."""
    return lane.log_slot is not None or not all(slot.here for slot in lane.slots.values())
