"""The thread boundary: every way trainbus reaches an event loop from another thread.

Every crossing from a thread into the loop goes through here (``tests/test_bridge.py``
fails on any other): the bus's, the loggers' and the built-ins' (the checkpoint uploader,
the dashboard). anyio gives blocking round trips (``from_thread.run``); the bus also needs
the fire-and-forget call that asyncio and trio both have (``call_soon_threadsafe``,
``TrioToken.run_sync_soon``), so that what is queued while the loop is busy costs one
wake-up. The tools:

- :class:`LoopHandle`: call a function soon on the loop, from any thread.
- :class:`LoopWaker`: wake the sleeping loop lanes, one call into the loop.
- :class:`Spawner`: run a coroutine function as a task on the loop for a thread, and wait.
- :class:`LoopThread`: an event loop on a daemon thread of its own, for plain code that
  calls the engine with no loop running, and for the ``Dashboard``'s server.
- :func:`no_running_loop`: whether the calling thread runs no loop.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, MutableSequence, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from trainbus.bus.lanes import WAKE_END
from trainbus.bus.threads import start_thread

if TYPE_CHECKING:
    from trainbus.bus.lanes import Counters, Lane, LoopEvent, WorkItem

__all__ = [
    "FutureEvent",
    "LoopHandle",
    "LoopThread",
    "LoopWaker",
    "Spawner",
    "no_running_loop",
]

T = TypeVar("T")


class LoopHandle:
    """The running event loop, callable from any thread. Create it on the loop.

    Attributes:
        call_soon: ``call_soon(fn, *args)`` runs ``fn(*args)`` soon on the loop; returns at
            once (any thread; raises once the loop has ended).
        thread_id: The loop's thread.
        backend: ``"asyncio"`` or ``"trio"``, for code that must pick a library's API by
            the loop it runs on (obstore's ``*_async`` functions need asyncio).

    Invariant: every field is set once, on the loop; of its callables, other threads call
    only :attr:`call_soon`.
    """

    __slots__ = ("backend", "call_soon", "current_time", "new_event", "thread_id", "yield_now")

    def __init__(self) -> None:
        self.thread_id = threading.get_ident()
        found = _current_call_soon()
        if found is None:
            raise RuntimeError("LoopHandle() must be created on a running asyncio or trio loop")
        self.call_soon: Callable[..., Any] = found
        running = asyncio.events._get_running_loop()
        self.backend = "asyncio" if running is not None else "trio"
        #: ``new_event()`` (on the loop): a one-shot event of the loop's own library, for
        #: the loop lanes' sleeps (see :class:`FutureEvent`).
        self.new_event: Callable[[], LoopEvent]
        #: ``await yield_now()`` (on the loop): give the loop one turn, as a sleep that is
        #: woken at once would (a loop lane at a ``WAKE_END`` with more queued).
        self.yield_now: Callable[[], Awaitable[None]]
        #: ``current_time()`` (on the loop, also in a :attr:`call_soon` callback, outside
        #: any task, where ``anyio.current_time()`` finds no event loop): the loop's clock,
        #: the one its cancel scopes' deadlines are on.
        self.current_time: Callable[[], float]
        if running is not None:
            self.new_event = functools.partial(FutureEvent, running)
            self.yield_now = functools.partial(asyncio.sleep, 0)
            self.current_time = running.time
        else:
            trio = sys.modules["trio"]
            self.new_event = trio.Event
            self.yield_now = trio.lowlevel.checkpoint
            self.current_time = trio.current_time

    def call_soon_if_running(self, fn: Callable[..., Any], *args: Any) -> None:
        """:attr:`call_soon`, or nothing if the loop has ended (an abandoned thread that
        got unstuck after its session)."""
        try:
            self.call_soon(fn, *args)
        except Exception:  # asyncio: "Event loop is closed"; trio: RunFinishedError
            return


class FutureEvent:
    """A loop lane's sleep on asyncio: one future, set once (loop thread).

    A loop lane sleeps once per wake-up that brought it work, on the hot path, so it awaits
    the bare future that ``asyncio.Event`` awaits underneath rather than an ``anyio.Event``
    (``docs/performance-notes.md`` says why). Its cancel scope cancels it as any awaited
    future. On trio the lane sleeps on a ``trio.Event``.
    """

    __slots__ = ("_future",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._future = loop.create_future()

    def set(self) -> None:
        if not self._future.done():
            self._future.set_result(None)

    def wait(self) -> asyncio.Future[None]:
        return self._future


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


class LoopWaker:
    """Hands work to the loop lanes and wakes the sleeping ones, from any thread: one call
    into the loop per :meth:`deliver` or :meth:`wake`. On the loop, :meth:`_on_loop`
    appends each delivered list of items to its lane's ``pending``, then ``WAKE_END``, and
    sets the wake-up of those lanes that sleep; a busy lane takes its items when it is done.

    Invariant: the calling thread never looks at the lanes (whether one sleeps is read on
    the loop), so a call costs it the same whatever the loop does; the loop alone counts
    ``loop_wakeups``.
    """

    def __init__(self, loop: LoopHandle, counters: Counters) -> None:
        self._call_soon = loop.call_soon
        self._counters = counters

    def deliver(self, waves: list[tuple[Lane, MutableSequence[WorkItem]]]) -> None:
        """Hand each ``(lane, items)`` to the loop and wake those lanes that sleep (the
        publishing thread; ``Producer.hand_over``)."""
        try:
            self._call_soon(self._on_loop, waves)
        except Exception:  # the loop has ended (an abandoned thread came back late)
            return

    def wake(self, lanes: Sequence[Lane]) -> None:
        """Ask the loop to wake those of ``lanes`` that sleep with items (any thread; the
        items are in their ``pending`` already)."""
        try:
            self._call_soon(self._on_woken, lanes)
        except Exception:  # the loop has ended (an abandoned thread came back late)
            return

    def _on_loop(self, waves: Sequence[tuple[Lane, MutableSequence[WorkItem]]]) -> None:
        self._counters.loop_wakeups += 1
        for lane, items in waves:
            pending = lane.pending
            pending.extend(items)
            pending.append(WAKE_END)
            # On the loop a lane's task is either asleep (idle) or running: never between.
            if lane.idle and lane.wakeup is not None:
                lane.wakeup.set()

    def _on_woken(self, lanes: Sequence[Lane]) -> None:
        self._counters.loop_wakeups += 1
        for lane in lanes:
            if lane.idle and lane.pending and lane.wakeup is not None:
                lane.wakeup.set()


class Spawner:
    """Runs, on the loop, the coroutine functions that threads hand over, and waits for them.

    anyio starts tasks only from a task, so one task (:meth:`serve`) takes the handed-over
    coroutine functions from a queue and starts each in the session's task group.

    Invariant: any thread appends to ``_queue``; the loop alone pops it and replaces
    ``_wakeup`` (``_poke`` comes by ``call_soon``).
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

    Daemon, so a process that never closes it still exits; :meth:`stop` ends it. One task
    starts the coroutines other threads hand in (as in :class:`Spawner`). It serves the
    engine's calls from plain code, and servers that must outlive ``fit()`` and need
    asyncio whatever the fit's backend (the ``Dashboard``'s uvicorn: :meth:`start_main`).

    Invariant: ``loop`` is set on the thread before ``_started``; any thread appends to
    ``_queue`` and sets ``_stopping``; the loop alone pops the queue and replaces ``_wakeup``.

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
