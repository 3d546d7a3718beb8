"""A session: the lanes running on one event loop, built afresh for each run.

One ``fit()`` (or one engine call from plain code) is one session. Everything that is
per-run lives here and is created when the session starts: the gate, the lanes' queues
and counters, the dispatcher, the lane threads, the producer's state. Nothing is reset;
what outlives a session (slots' statistics, the inline verdicts, the counters) lives in
the bus's members.

Every task of the session runs in a task group under a shielded scope: a task started
while the caller is being cancelled must still start (a handler hand-over, a coroutine for
a lane thread), or a lane would wait for it forever. Waits on user code are bounded by
``close_timeout``: a callback that misses it is reported and abandoned (its thread, if it
is stuck in a plain handler, is left behind as a daemon), and every other callback still
closes.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio

from trainbus.bus._bridge import LoopHandle, Spawner
from trainbus.bus._closing import Closing
from trainbus.bus._dispatcher import Dispatcher
from trainbus.bus._gate import Gate
from trainbus.bus._inline import InlinePath
from trainbus.bus._items import STOP
from trainbus.bus._lane import Lane
from trainbus.bus._producer import Producer
from trainbus.bus._records import Records
from trainbus.bus._stopped import Stopped
from trainbus.bus._threads import ThreadDriver
from trainbus.bus._warn import long_wait_message, warn_at
from trainbus.core.exceptions import CallbackTimeoutWarning, SlowCallbackWarning

if TYPE_CHECKING:
    from trainbus.bus._options import BusOptions
    from trainbus.bus._slot import Member
    from trainbus.bus._statistics import Counters
    from trainbus.core.callback import Handler
    from trainbus.core.events import Event
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["Session"]


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
        self.state = state
        self.logger = logger
        self.options = options
        self.loop = LoopHandle()
        self.gate = Gate(counters)
        self.gate.wait_warning = options.wait_warning
        self.gate.on_long_wait = self._warn_long_wait
        self.lanes = [Lane(member) for member in members]
        self.dispatcher = Dispatcher(
            self.gate, counters, self.loop, options.queue_size, options.inline_max
        )
        self.spawner = Spawner(self.loop)
        self.inline = InlinePath(
            self.gate, counters, options.inline_max, self.dispatcher.wake_lanes
        )
        self.producer = Producer(
            state=state,
            logger=logger,
            members=members,
            lanes=self.lanes,
            options=options,
            gate=self.gate,
            counters=counters,
            inline=self.inline,
            dispatcher=self.dispatcher,
            warn=self._warn_slow,
        )
        self.records = Records(
            self.lanes,
            options.queue_size,
            self.gate,
            self.dispatcher,
            lambda: self.producer.ident,
            self.producer.wait_for_records,
            self.inline.defer_records,
            self.inline.run_records,
        )
        self.closing = Closing(state, logger, self.lanes, options, self._emit)
        self._drivers: dict[int, ThreadDriver] = {}
        for lane in self.lanes:
            lane.notify = self.gate.reached
            if lane.on_thread:
                lane.wake_driver = _put_token
                self._drivers[lane.index] = ThreadDriver(
                    lane, self.gate, counters, self.loop, self.spawner, options.inline_max
                )
            else:
                lane.wake_driver = self.dispatcher.wake_lane

    # -- lifecycle -------------------------------------------------------------------------

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Session]:
        """Run the lanes on the current loop for the duration of the block.

        On exit the lanes finish what is queued (event handlers are skipped once the
        session stopped; log records are delivered), within ``close_timeout``; then their
        threads and tasks end. Nothing started here outlives the block except the thread
        of a lane abandoned while stuck in a plain handler.
        """
        internal = anyio.CancelScope(shield=True)
        async with anyio.create_task_group() as outer:
            with anyio.CancelScope(shield=True):
                tg = await outer.start(_run_internal, internal)
            threads_done: dict[int, anyio.Event] = {}
            for lane in self.lanes:
                driver = self._drivers.get(lane.index)
                if driver is not None:
                    threads_done[lane.index] = done = anyio.Event()
                    lane.thread = threading.Thread(
                        target=self._thread_main,
                        args=(driver, done),
                        name=f"trainbus-lane-{lane.name}",
                        daemon=True,
                    )
                    lane.thread.start()
            self.dispatcher.start(tg)
            tg.start_soon(self.spawner.serve, tg)
            background = anyio.CancelScope()
            tg.start_soon(self._run_backgrounds, background)
            for record in self.logger._connect(self.records.submit):
                self.records.submit(record)
            try:
                yield self
            finally:
                with anyio.CancelScope(shield=True):
                    await self.drain()
                    self.logger._connect(None)
                    background.cancel()
                    self.inline.close()
                    self.dispatcher.stop()
                    for lane in self.lanes:
                        if lane.thread is not None:
                            lane.pending.append(STOP)
                            lane.wake()
                    for index, event in threads_done.items():
                        if not self.lanes[index].abandoned:
                            await event.wait()
                    for lane in self.lanes:
                        if lane.thread is not None and not lane.abandoned:
                            lane.thread.join()
                    internal.cancel()

    def _thread_main(self, driver: ThreadDriver, finished: anyio.Event) -> None:
        loop = self.loop
        try:
            try:
                driver.run()
            except BaseException as exc:  # a bug of ours: fail the run rather than hang it
                self.gate.fail(exc, None, None)
                driver.drain_broken(exc)
        finally:
            loop.call_soon_if_running(finished.set)

    async def _run_backgrounds(self, scope: anyio.CancelScope) -> None:
        with scope:
            async with anyio.create_task_group() as tg:
                for lane in self.lanes:
                    handler = lane.member.table.extra.get("background")
                    if handler is not None:
                        tg.start_soon(self._background, handler)

    async def _background(self, handler: Handler) -> None:
        try:
            await handler.fn(self.state, self.logger)
        except Exception as exc:
            self.gate.fail(exc, handler, None)

    # -- the producer thread ---------------------------------------------------------------

    async def run_producer(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on a new producer thread and wait for it, cancellably.

        If the waiting task is cancelled, the session stops, the producer unwinds at its
        next event, and the cancellation propagates once the thread has ended (D11), or
        once ``close_timeout`` has passed (then the thread is reported and left behind).
        Exceptions from ``fn`` other than :class:`Stopped` are re-raised here.
        """
        loop = self.loop
        finished = anyio.Event()
        box: list[BaseException] = []
        producer = self.producer

        def main() -> None:
            producer.ident = threading.get_ident()
            try:
                fn()
            except Stopped:  # the session stopped it: not an error of its own
                pass
            except BaseException as exc:
                box.append(exc)
            finally:
                producer.ident = None
                loop.call_soon_if_running(finished.set)

        thread = threading.Thread(target=main, name="trainbus-train", daemon=True)
        thread.start()
        try:
            await finished.wait()
        except BaseException:
            self.stop()
            self.cancel_in_flight()
            closing = self.closing
            with anyio.move_on_after(closing.timeout(), shield=True) as scope:
                closing.bounded_scopes.add(scope)
                await finished.wait()
            closing.bounded_scopes.discard(scope)
            if finished.is_set():
                thread.join()
            else:
                closing.warn_stuck("the training thread", "its current step")
            raise
        thread.join()
        if box:
            raise box[0]

    def stop(self) -> None:
        """Stop the producer at its next event or wait (any thread)."""
        self.gate.stop()

    def cancel_in_flight(self) -> None:
        """Cancel the coroutine handlers running now (loop thread only)."""
        for lane in self.lanes:
            if lane.scope is not None:
                lane.scope.cancel()

    def abandon(self) -> None:
        """Give up on what is stuck now; close the rest under a short deadline (loop)."""
        self.stop()
        self.closing.abandon()
        self.cancel_in_flight()

    def describe_waiting(self) -> str:
        """What runs or waits now, e.g. ``"Upload.batch_end, Metrics"`` (any thread)."""
        busy = []
        for lane in self.lanes:
            current = lane.current
            if current is not None:
                busy.append(current)
            elif lane.done < lane.enq:
                busy.append(lane.name)
        return ", ".join(busy)

    async def drain(self) -> None:
        """Wait until every lane has run everything queued so far (or was abandoned)."""
        await self.closing.drain()

    async def close_callbacks(self) -> list[BaseException]:
        """Run every ``close`` (destinations last), then every ``post_close``; see
        :meth:`Closing.close_callbacks <trainbus.bus._closing.Closing.close_callbacks>`."""
        return await self.closing.close_callbacks()

    # -- warnings on the loop --------------------------------------------------------------

    def _emit(self, message: str, category: type[Warning], where: object = None) -> None:
        """Warn on the loop thread, at ``where``'s code; an error-warning fails the run."""
        try:
            warn_at(message, category, where)
        except Warning as exc:
            self.gate.fail(exc, None, None)

    def _warn_long_wait(
        self, kind: str, event: Event | None, lanes: list[Lane], seconds: float
    ) -> None:
        """The training thread has waited ``seconds`` for ``lanes`` (producer thread)."""
        where = lanes[0].member.table.callback if lanes else None
        message = long_wait_message(kind, event, lanes, seconds)
        self.loop.call_soon(self._emit, message, CallbackTimeoutWarning, where)

    def _warn_slow(self, message: str, where: object) -> None:
        """Emit a SlowCallbackWarning on the loop thread, where the caller's filters apply."""
        self.loop.call_soon(self._emit, message, SlowCallbackWarning, where)


async def _run_internal(
    scope: anyio.CancelScope,
    *,
    task_status: anyio.abc.TaskStatus[anyio.abc.TaskGroup] = anyio.TASK_STATUS_IGNORED,
) -> None:
    with scope:
        async with anyio.create_task_group() as tg:
            task_status.started(tg)
            await anyio.sleep_forever()


def _put_token(lane: Lane) -> None:
    lane.tokens.put(None)



