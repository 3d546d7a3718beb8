"""The thread boundary: every way trainbus reaches an event loop from another thread.

The bus's crossings, the loggers' (lane threads hand batches to the loop) and the built-ins'
(the checkpoint uploader, the dashboard) all come here. Besides anyio's blocking round trips
the bus needs the cheaper fire-and-forget call of asyncio and trio (``call_soon_threadsafe``,
``TrioToken.run_sync_soon``): what is queued while the loop is busy costs one wake-up::

    any thread  --LoopHandle.call_soon(fn)--> fn() soon, on the running loop
    lane thread --Spawner.run(fn)-----------> await fn() in a task on that loop; it waits
    plain code  --LoopThread.call(fn)-------> await fn() on a loop of a daemon thread

A :class:`LoopThread` serves the engine called with no loop running (``engine.run_event``
outside ``fit()``) and the ``Dashboard``'s asyncio server, which outlives ``fit()``.
``tests/test_bridge.py`` fails if any other module of trainbus makes such a crossing.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar

import anyio

from trainbus.core.threads import start_thread

__all__ = ["OWN_LOOP", "LoopEvent", "LoopHandle", "LoopThread", "Spawner", "no_running_loop"]

T = TypeVar("T")

#: Set (in the loop's context) by ``fit_sync()``/``run_sync()``: trainbus started this loop
#: (the bus may then interrupt a handler that holds it past a close deadline).
OWN_LOOP: ContextVar[bool] = ContextVar("trainbus_own_loop", default=False)


class LoopEvent(Protocol):
    """What a worker on the loop sleeps on (``worker.py``): ``set()`` and
    ``await event.wait()``, on the loop."""

    def set(self) -> None: ...

    def wait(self) -> Awaitable[Any]: ...


class LoopHandle:
    """The running event loop, callable from any thread. Create it on the loop.

    Attributes:
        call_soon: ``call_soon(fn, *args)`` runs ``fn(*args)`` soon on the loop; returns at
            once (any thread; raises once the loop has ended).
        thread_id: The loop's thread.
        backend: ``"asyncio"`` or ``"trio"``, for code that must pick a library's API by
            the loop it runs on (obstore's ``*_async`` functions need asyncio).
        asyncio_loop: The asyncio loop itself (``None`` on trio): a worker sleeps on its
            futures.
        yield_now: ``await yield_now()`` (on the loop) gives the loop one turn.
        current_time: The loop's clock, the one its cancel scopes' deadlines are on; unlike
            ``anyio.current_time()`` it works in a :attr:`call_soon` callback too.

    Invariant: every field is set once, by ``__init__``; any thread reads them.
    """

    __slots__ = ("asyncio_loop", "backend", "call_soon", "current_time", "thread_id",
                 "yield_now")

    def __init__(self) -> None:
        self.thread_id = threading.get_ident()
        found = _current_call_soon()
        if found is None:
            raise RuntimeError("LoopHandle() must be created on a running asyncio or trio loop")
        self.call_soon: Callable[..., Any] = found
        running = asyncio.events._get_running_loop()
        self.backend = "asyncio" if running is not None else "trio"
        self.asyncio_loop = running
        if running is not None:
            self.yield_now: Callable[[], Awaitable[None]] = functools.partial(asyncio.sleep, 0)
            self.current_time: Callable[[], float] = running.time
        else:
            trio = sys.modules["trio"]
            self.yield_now = trio.lowlevel.checkpoint
            self.current_time = trio.current_time

    def call_soon_if_running(self, fn: Callable[..., Any], *args: Any) -> None:
        """:attr:`call_soon`, or nothing if the loop has ended (an abandoned thread that
        got unstuck after its session)."""
        try:
            self.call_soon(fn, *args)
        except Exception:  # asyncio: "Event loop is closed"; trio: RunFinishedError
            return


def _current_call_soon() -> Callable[..., Any] | None:
    try:
        return asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:
        pass
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            return trio.lowlevel.current_trio_token().run_sync_soon  # type: ignore[no-any-return]
        except RuntimeError:
            pass
    return None


def no_running_loop() -> bool:
    """Whether the calling thread runs no asyncio or trio event loop (cheap: no exception
    is raised when none runs, since plain-code ``engine.run_event()`` asks every call)."""
    if asyncio.events._get_running_loop() is not None:
        return False
    trio = sys.modules.get("trio")
    if trio is None:
        return True
    in_run = getattr(trio.lowlevel, "in_trio_run", None)
    if in_run is not None:
        return not in_run()
    return _current_call_soon() is None


class Spawner:
    """Starts, on the loop, the coroutine functions that other threads hand over.

    anyio starts tasks only from a task, so one task (:meth:`serve`) takes the handed-over
    coroutine functions from a queue and starts each in a task group. Create it on the loop.
    """

    def __init__(self, loop: LoopHandle) -> None:
        self._loop = loop
        # Invariant: any thread appends to ``_queue``, then pokes; only :meth:`serve` pops.
        self._queue: deque[Callable[[], Coroutine[Any, Any, None]]] = deque()
        self._wakeup = anyio.Event()  # replaced by serve, set by _poke: both on the loop
        # Invariant: set once (any thread), then a poke; serve returns at its next wake-up.
        self._stopping = False

    async def serve(
        self,
        tg: anyio.abc.TaskGroup,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Start handed-over coroutines in ``tg`` until cancelled or stopped (loop thread);
        ``tg.start(spawner.serve, tg)`` returns once it serves."""
        queue = self._queue
        task_status.started()
        while not self._stopping:
            await self._wakeup.wait()
            self._wakeup = anyio.Event()
            while queue:
                tg.start_soon(queue.popleft())

    def _poke(self) -> None:
        self._wakeup.set()

    def start_soon(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Start ``fn()`` as a task soon, without waiting (any thread)."""
        self._queue.append(fn)
        self._loop.call_soon(self._poke)

    def stop(self) -> None:
        """End :meth:`serve` at its next wake-up (any thread; nothing if the loop ended)."""
        self._stopping = True
        self._loop.call_soon_if_running(self._poke)

    def run(self, fn: Callable[..., Awaitable[Any]], *args: Any,
            on_scope: Callable[[anyio.CancelScope | None], None] | None = None) -> None:
        """Run ``await fn(*args)`` in a task on the loop; block this thread until it ends;
        re-raise its exception. ``on_scope`` is told the task's cancel scope (and ``None``
        at its end), so the bus can cancel it like any handler on the loop (D11)."""
        done = threading.Event()
        box: list[BaseException] = []

        async def runner() -> None:
            try:
                with anyio.CancelScope() as scope:
                    if on_scope is not None:
                        on_scope(scope)
                    await fn(*args)
            except BaseException as exc:
                box.append(exc)
            finally:
                if on_scope is not None:
                    on_scope(None)
                done.set()

        self._queue.append(runner)  # start_soon, written out: once per handler call
        self._loop.call_soon(self._poke)
        done.wait()
        if box:
            raise box[0]


class LoopThread:
    """An event loop on a daemon thread of its own, serving calls from other threads.

    Daemon, so a process that never closes it still exits; :meth:`stop` ends it. Its loop
    starts the coroutines other threads hand in with a :class:`Spawner`.

    Args:
        name: The thread's name.
        backend: The loop's anyio backend, ``"asyncio"`` or ``"trio"``.

    Raises:
        ThreadStartError: The operating system refused the thread (nothing was started).
    """

    def __init__(self, name: str, backend: str = "asyncio") -> None:
        self._started = threading.Event()
        self.backend = backend
        # Invariant: these two are set once, on the loop, before ``_started`` is.
        self.loop: LoopHandle | None = None
        self._spawner: Spawner | None = None
        self._thread = threading.Thread(
            target=lambda: anyio.run(self._serve, backend=backend), name=name, daemon=True
        )
        start_thread(self._thread, needed="It runs an event loop for calls from plain code")
        self._started.wait()

    async def _serve(self) -> None:
        self.loop = LoopHandle()
        self._spawner = Spawner(self.loop)
        self._started.set()
        async with anyio.create_task_group() as tg:
            await self._spawner.serve(tg)

    def is_alive(self) -> bool:
        """Whether the thread (and its loop) still runs."""
        return self._thread.is_alive()

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start ``fn(*args)`` as a task on the loop without waiting (another thread)."""
        assert self._spawner is not None

        async def runner() -> None:
            await fn(*args)

        self._spawner.start_soon(runner)

    def start_main(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start ``fn(*args)``, a long-lived task (a server), without waiting; the loop and
        its thread end once it returns or raises (its exception ends the thread), or at
        :meth:`stop` once every task has ended (another thread)."""
        assert self._spawner is not None
        spawner = self._spawner

        async def main() -> None:
            try:
                await fn(*args)
            finally:
                spawner.stop()

        self.start_soon(main)

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await fn(*args)`` on the loop and return its result (another thread)."""
        future: Future[T] = Future()

        async def runner() -> None:
            try:
                future.set_result(await fn(*args))
            except BaseException as exc:
                future.set_exception(exc)

        self.start_soon(runner)
        return future.result()

    def stop(self, timeout: float | None = None) -> None:
        """End the loop once its tasks are done, and its thread (another thread); wait at
        most ``timeout`` seconds for them (``None``: for as long as they take)."""
        if self._thread.is_alive() and self._spawner is not None:
            self._spawner.stop()
            self._thread.join(timeout)
