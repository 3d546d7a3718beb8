"""The thread boundary: every way trainbus reaches an event loop from another thread.

Every crossing from a thread into the loop goes through this module: the bus's, the
loggers' (their lane threads hand batches to the loop) and the built-ins' (the checkpoint
uploader, the dashboard). anyio gives blocking round trips (``from_thread.run``); the bus
also needs the cheaper fire-and-forget call that asyncio and trio both have
(``call_soon_threadsafe``, ``TrioToken.run_sync_soon``), so that what is queued while the
loop is busy costs one wake-up. The tools:

- :class:`LoopHandle`: call a function soon on the loop, from any thread.
- :class:`Spawner`: run a coroutine function as a task on the loop for a thread and wait
  for it (a thread lane's ``async def`` handlers).
- :class:`LoopThread`: a daemon thread running an event loop of its own, for plain code
  that calls the engine with no loop running (``engine.run_event`` outside ``fit()``), and
  for the ``Dashboard``'s server, which needs asyncio and outlives ``fit()``.
- :func:`no_running_loop`: whether the calling thread runs no loop.

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
from typing import Any, Protocol, TypeVar

import anyio

from trainbus.core.threads import start_thread

__all__ = [
    "LoopEvent",
    "LoopHandle",
    "LoopThread",
    "Spawner",
    "no_running_loop",
]

T = TypeVar("T")


class LoopEvent(Protocol):
    """What a worker on the loop sleeps on: a one-shot event (``worker.py``): ``set()`` and
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
        #: The asyncio loop itself (``None`` on trio): a worker sleeps on its futures.
        self.asyncio_loop = running
        #: ``await yield_now()`` (on the loop): give the loop one turn, as a sleep that is
        #: woken at once would (a worker at a ``WAKE_END`` with more queued).
        self.yield_now: Callable[[], Awaitable[None]]
        #: ``current_time()`` (on the loop, also in a :attr:`call_soon` callback, outside
        #: any task, where ``anyio.current_time()`` finds no event loop): the loop's clock,
        #: the one its cancel scopes' deadlines are on.
        self.current_time: Callable[[], float]
        if running is not None:
            self.yield_now = functools.partial(asyncio.sleep, 0)
            self.current_time = running.time
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
    """Runs, on the loop, the coroutine functions that threads hand over, and waits for them.

    anyio starts tasks only from a task, so one task (:meth:`serve`) takes the handed-over
    coroutine functions from a queue and starts each in the session's task group.
    """

    def __init__(self, loop: LoopHandle) -> None:
        self._loop = loop
        self._queue: deque[Callable[[], Coroutine[Any, Any, None]]] = deque()
        self._wakeup = anyio.Event()

    async def serve(self, tg: anyio.abc.TaskGroup) -> None:
        """Start handed-over coroutines in ``tg`` until cancelled (loop thread)."""
        queue = self._queue
        while True:
            await self._wakeup.wait()
            self._wakeup = anyio.Event()
            while queue:
                tg.start_soon(queue.popleft())

    def _poke(self) -> None:
        self._wakeup.set()

    def run(
        self,
        fn: Callable[..., Awaitable[Any]],
        *args: Any,
        on_scope: Callable[[anyio.CancelScope | None], None] | None = None,
    ) -> None:
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

        self._queue.append(runner)
        self._loop.call_soon(self._poke)
        done.wait()
        if box:
            raise box[0]


class LoopThread:
    """An event loop on a daemon thread of its own, serving calls from other threads.

    Daemon, so a process that never closes it still exits; :meth:`stop` ends it. (anyio
    starts tasks only from a task, so one task starts the coroutines other threads hand
    in, as :class:`Spawner` does.) It serves the engine's calls from plain code, and the
    built-ins whose server must outlive ``fit()`` and needs asyncio whatever backend the
    fit runs on (the ``Dashboard``'s uvicorn: :meth:`start_main`).

    Args:
        name: The thread's name.
        backend: The loop's anyio backend, ``"asyncio"`` or ``"trio"``.

    Raises:
        ThreadStartError: The operating system refused the thread (nothing was started).
    """

    def __init__(self, name: str, backend: str = "asyncio") -> None:
        self._started = threading.Event()
        self._queue: deque[Callable[[], Coroutine[Any, Any, None]]] = deque()
        self._wakeup: anyio.Event | None = None
        self._stopping = False
        self.backend = backend
        self.loop: LoopHandle | None = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        start_thread(self._thread, needed="It runs an event loop for calls from plain code")
        self._started.wait()

    def _main(self) -> None:
        anyio.run(self._serve, backend=self.backend)

    async def _serve(self) -> None:
        self.loop = LoopHandle()
        self._wakeup = anyio.Event()
        self._started.set()
        async with anyio.create_task_group() as tg:
            while not self._stopping:
                await self._wakeup.wait()
                self._wakeup = anyio.Event()
                while self._queue:
                    tg.start_soon(self._queue.popleft())

    def _poke(self) -> None:
        assert self._wakeup is not None
        self._wakeup.set()

    def is_alive(self) -> bool:
        """Whether the thread (and its loop) still runs."""
        return self._thread.is_alive()

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start ``fn(*args)`` as a task on the loop without waiting (another thread)."""
        assert self.loop is not None

        async def runner() -> None:
            await fn(*args)

        self._queue.append(runner)
        self.loop.call_soon(self._poke)

    def start_main(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start ``fn(*args)``, a long-lived task (a server), without waiting; the loop and
        its thread end once it returns or raises (its exception ends the thread), or at
        :meth:`stop` once every task has ended (another thread)."""

        async def main() -> None:
            try:
                await fn(*args)
            finally:
                self._stopping = True
                self._poke()

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
        if self._thread.is_alive() and self.loop is not None:
            self._stopping = True
            self.loop.call_soon_if_running(self._poke)
            self._thread.join(timeout)
