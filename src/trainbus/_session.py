"""The loop side of the bus's lifecycle: sessions, close, the producer thread.

:class:`LoopSide` is mixed into :class:`~trainbus._bus.EventBus`; everything here runs
on the event loop (or hands work to it from a lane thread), while ``_bus.py`` holds what
the producer thread calls.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any, cast

import anyio

from trainbus._bridge import LoopHandle
from trainbus._callback import Handler
from trainbus._exceptions import EngineThreadError
from trainbus._lanes import CALL, STOP, Lane, drain_broken, thread_driver
from trainbus._slow import SlowCallbacks
from trainbus._stopped import Stopped

if TYPE_CHECKING:
    from trainbus._bus import EventBus
    from trainbus._dispatch import Dispatcher
    from trainbus._logger import Logger, LogRecord
    from trainbus._state import State

__all__ = ["LoopSide"]


class LoopSide:
    """Session lifecycle, close and producer management (loop thread)."""

    if TYPE_CHECKING:  # provided by EventBus
        lanes: list[Lane]
        state: State
        logger: Logger
        stopping: bool
        errors: list[BaseException]
        _loop: LoopHandle | None
        _tg: anyio.abc.TaskGroup | None
        _producer_ident: int | None
        _dispatcher: Dispatcher
        _deferred: list[Lane]
        _signal: SimpleQueue[bool]
        _marks: deque[list[int]]
        slow: SlowCallbacks
        _view_key: tuple[Any, Any]
        _view: tuple[State, Logger] | None
        _spawn_queue: deque[Callable[[], Any]]
        _spawn_wakeup: anyio.Event | _NoEvent

        @property
        def loop(self) -> LoopHandle: ...
        def stop(self) -> None: ...
        def _fail(self, exc: BaseException, handler: Handler | None, event: Any) -> None: ...
        def _wake(self, lane: Lane) -> None: ...
        def _submit_log(self, record: LogRecord) -> None: ...

    def _await_from_thread(
        self, lane: Lane, fn: Callable[..., Any], *args: Any, cancellable: bool = False
    ) -> None:
        """Run ``await fn(*args)`` on the loop for ``lane``'s thread and wait for it.

        The coroutine runs in its own task. With ``cancellable`` (event handlers) its scope
        is registered as ``lane.scope``, so cancelling ``fit()`` reaches it like any handler
        on the loop (D11); log records and close calls are always delivered in full.
        """
        done = threading.Event()
        box: list[BaseException] = []

        async def runner() -> None:
            try:
                with anyio.CancelScope() as scope:
                    if cancellable:  # an event handler: cancel_in_flight() may end it
                        lane.scope = scope
                    await fn(*args)
            except BaseException as exc:
                box.append(exc)
            finally:
                lane.scope = None
                done.set()

        self._spawn_queue.append(runner)
        self.loop.call_soon(self._spawn_wakeup.set)
        done.wait()
        if box:
            raise box[0]

    async def _spawner(self, tg: anyio.abc.TaskGroup) -> None:
        """Start the coroutines lane threads hand over (anyio needs a task to spawn)."""
        queue = self._spawn_queue
        while True:
            await self._spawn_wakeup.wait()
            self._spawn_wakeup = anyio.Event()
            while queue:
                tg.start_soon(queue.popleft())

    async def _in_lane(self, lane: Lane, fn: Callable[[], Any], is_async: bool) -> None:
        """Run ``fn`` as the next item of ``lane`` and wait for it; re-raise its error."""
        finished = anyio.Event()
        box: list[BaseException] = []

        def on_done(error: BaseException | None) -> None:
            if error is not None:
                box.append(error)
            finished.set()

        lane.pending.append((CALL, fn, is_async, on_done))
        self._wake(lane)
        await finished.wait()
        if box:
            raise box[0]

    @asynccontextmanager
    async def session(self) -> AsyncIterator[EventBus]:
        """Run the lanes on the current loop for the duration of the block.

        On exit the lanes finish everything queued (event handlers are skipped if the
        bus stopped; log records are always delivered), then their threads and tasks
        end. Nothing started here outlives the block.
        """
        if self._loop is not None:
            raise EngineThreadError("the bus already has a running session")
        self._loop = LoopHandle()
        self.stopping = False
        self.errors = []
        self._signal = SimpleQueue()
        self._marks.clear()
        self.slow = SlowCallbacks()
        self._view_key = (None, None)
        self._view = None
        self._deferred = []
        for lane in self.lanes:
            lane.reset()
        internal = anyio.CancelScope(shield=True)
        try:
            async with anyio.create_task_group() as outer:
                # Every task of the bus lives in a task group under a shielded scope: a task
                # started while the caller is being cancelled must still start (a handler
                # hand-over, a coroutine for a lane thread), or a lane waits for it forever.
                with anyio.CancelScope(shield=True):  # a cancelled caller must still unwind it
                    tg = await outer.start(self._run_internal, internal)
                self._tg = tg
                threads_done = {lane.index: anyio.Event() for lane in self.lanes if lane.on_thread}
                for lane in self.lanes:
                    if lane.on_thread:
                        lane.thread = threading.Thread(
                            target=self._thread_main,
                            args=(lane, threads_done[lane.index]),
                            name=f"trainbus-lane-{lane.name}",
                            daemon=True,
                        )
                        lane.thread.start()
                self._dispatcher.start(tg)
                self._spawn_queue = deque()
                self._spawn_wakeup = anyio.Event()
                tg.start_soon(self._spawner, tg)
                background = anyio.CancelScope()
                tg.start_soon(self._run_backgrounds, background)
                for record in self.logger._connect(self._submit_log):
                    self._submit_log(record)
                try:
                    yield cast("EventBus", self)
                finally:
                    with anyio.CancelScope(shield=True):
                        await self.drain()
                        self.logger._connect(None)
                        background.cancel()
                        self._dispatcher.stop()
                        for lane in self.lanes:
                            if lane.on_thread:
                                lane.pending.append((STOP,))
                                lane.tokens.put(None)
                        for event in threads_done.values():
                            await event.wait()
                        for lane in self.lanes:
                            if lane.thread is not None:
                                lane.thread.join()
                        internal.cancel()
        finally:
            self._tg = None
            self._loop = None

    async def _run_internal(
        self,
        scope: anyio.CancelScope,
        *,
        task_status: anyio.abc.TaskStatus[anyio.abc.TaskGroup] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        with scope:
            async with anyio.create_task_group() as tg:
                task_status.started(tg)
                await anyio.sleep_forever()

    def cancel_in_flight(self) -> None:
        """Cancel the coroutine handlers running now (loop thread only)."""
        for lane in self.lanes:
            if lane.scope is not None:
                lane.scope.cancel()

    def _thread_main(self, lane: Lane, finished: anyio.Event) -> None:
        loop = self.loop
        bus = cast("EventBus", self)
        try:
            try:
                thread_driver(bus, lane)
            except BaseException as exc:  # a bug of ours: fail the run rather than hang it
                self._fail(exc, None, None)
                drain_broken(bus, lane, exc)
        finally:
            loop.call_soon(finished.set)

    async def _run_backgrounds(self, scope: anyio.CancelScope) -> None:
        with scope:
            async with anyio.create_task_group() as tg:
                for lane in self.lanes:
                    handler = lane.table.extra.get("background")
                    if handler is not None:
                        tg.start_soon(self._background, handler)

    async def _background(self, handler: Handler) -> None:
        try:
            await handler.fn(self.state, self.logger)
        except Exception as exc:
            self._fail(exc, handler, None)

    async def drain(self) -> None:
        """Wait until every lane has run everything queued so far."""
        async with anyio.create_task_group() as tg:
            for lane in self.lanes:
                tg.start_soon(self._in_lane, lane, _noop, False)

    async def close_callbacks(self) -> list[BaseException]:
        """Run every ``close`` (destinations last), then every ``post_close``.

        Each runs on its callback's lane, after what the lane had queued. Returns the
        exceptions raised, each with a note naming its callback; one failing ``close``
        does not stop the others.
        """
        errors: list[BaseException] = []
        await self.drain()  # close is a barrier: every handler of every callback is done

        async def call(lane: Lane, handler: Handler, *args: Any) -> None:
            try:
                await self._in_lane(lane, lambda: handler.fn(*args), handler.is_async)
            except Exception as exc:
                exc.add_note(f"raised by {handler.qualname}")
                errors.append(exc)

        for group in (False, True):  # callbacks first, then destinations
            async with anyio.create_task_group() as tg:
                for lane in self.lanes:
                    close = lane.table.close
                    if close is not None and lane.is_destination is group:
                        tg.start_soon(call, lane, close, self.state, self.logger)
        async with anyio.create_task_group() as tg:
            for lane in self.lanes:
                post = lane.table.post_close
                if post is not None:
                    tg.start_soon(call, lane, post)
        return errors

    async def run_producer(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on a new producer thread and wait for it, cancellably.

        If the waiting task is cancelled, the bus stops, the producer unwinds at its
        next event, and the cancellation propagates once the thread has ended (D11).
        Exceptions from ``fn`` other than :class:`Stopped` are re-raised here.
        """
        loop = self.loop
        finished = anyio.Event()
        box: list[BaseException] = []

        def main() -> None:
            self._producer_ident = threading.get_ident()
            try:
                fn()
            except Stopped:  # the bus stopped it: not an error of its own
                pass
            except BaseException as exc:
                box.append(exc)
            finally:
                self._producer_ident = None
                loop.call_soon(finished.set)

        thread = threading.Thread(target=main, name="trainbus-train", daemon=True)
        thread.start()
        try:
            await finished.wait()
        except BaseException:
            self.stop()
            self.cancel_in_flight()
            with anyio.CancelScope(shield=True):
                await finished.wait()
            thread.join()
            raise
        thread.join()
        if box:
            raise box[0]


def _noop() -> None:
    return None


class _NoEvent:
    """Stands in for the spawner's event outside a session."""

    def set(self) -> None:
        raise RuntimeError("the bus has no running session")

    async def wait(self) -> None:
        raise RuntimeError("the bus has no running session")
