"""Deadlines the event loop cannot keep (a close's ``close_timeout``, a barrier's
``wait_warning``) while an ``async def`` handler holds its thread without awaiting.

:class:`LoopWatch` keeps them from a thread of its own: past a deadline (a close's by
``CLOSE_MARGIN_S``), if the loop runs user code and no call handed to it runs in
``CONFIRM_S``, the holder is named on stderr, once; past a ``close_timeout`` under
``fit_sync()`` (:data:`OWN_LOOP`) it is also interrupted. ``docs/concurrency.md``, "Close",
tabulates what happens where (D7).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from trainbus.core.bridge import OWN_LOOP
from trainbus.core.exceptions import HandlerInterrupted, ThreadStartError
from trainbus.core.threads import start_thread

if TYPE_CHECKING:
    from trainbus.bus.worker import Lane
    from trainbus.core.bridge import LoopHandle

__all__ = ["CONFIRM_S", "LoopWatch"]

#: Seconds a held loop's thread is given to run a handed-over call before it counts as held.
CONFIRM_S = 1.0
#: Seconds after a close deadline that its watch looks (the loop's own cancel comes first).
CLOSE_MARGIN_S = 0.5
_WATCH_ROLE = "It keeps the bus's close deadlines (every callback was closed without it)"
_IDLE = ("/selectors.py", "/asyncio/", "/trio/", "/anyio/", "/threading.py", "/selectors")


class LoopWatch:
    """Keeps the loop-side deadlines of one session from outside the loop (module doc).

    Attributes:
        refused: The system refused the watch thread: the session raises it once closed.
    """

    def __init__(self, loop: LoopHandle, lanes: Sequence[Lane]) -> None:
        self.loop = loop
        self.lanes = lanes
        self.interrupt = OWN_LOOP.get()  # read on the loop, where the session is built
        # Invariant: ``_armed`` (token -> (when to look, what it is)), ``_thread`` (runs
        # while something is armed) and ``_reported`` (the holders named already) change
        # only under ``_changed``.
        self._reported: set[str] = set()
        self._armed: dict[int, tuple[float, str]] = {}
        self._thread: threading.Thread | None = None
        self._changed = threading.Condition()
        self._tokens = itertools.count()
        # Invariant: written on the loop (``armed``), read there at the session's end.
        self.refused: ThreadStartError | None = None

    def check(self, deadline: str, *, interrupt: bool = True) -> None:
        """The ``deadline`` passed: from a thread not the loop's, name a handler that holds
        the loop (waiting at most :data:`CONFIRM_S`), and interrupt it if the loop is ours and
        ``interrupt`` (``close_timeout``; ``False`` for ``wait_warning``, a threshold)."""
        tid = self.loop.thread_id
        if tid == threading.get_ident() or not _runs_user_code(tid):
            return
        answered = threading.Event()
        self.loop.call_soon_if_running(answered.set)
        if answered.wait(CONFIRM_S) or not _runs_user_code(tid):
            return
        running = [lane.current for lane in self.lanes if lane.scope is not None and lane.current]
        held = " or ".join(running) or "an async def handler"
        with self._changed:
            first = held not in self._reported
            self._reported.add(held)
        interrupting = self.interrupt and interrupt
        if interrupting:
            what = "raising HandlerInterrupted in it (fit_sync() owns the loop)"
        elif self.interrupt:
            what = ("the run waits for it (wait_warning only warns; close_timeout, or a "
                    "preemption's deadline, ends a handler's wait): make it await")
        else:
            what = ("it cannot be interrupted in your own event loop (await trainer.fit()): the "
                    "run waits for it; make it await, or a plain def (its own thread)")
        if first or interrupting:
            print(f"trainbus: {held} has held the event loop's thread past {deadline} without "
                  f"awaiting (a loop with no await?); {what}", file=sys.stderr, flush=True)
        if interrupting:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(tid), ctypes.py_object(HandlerInterrupted)
            )

    @contextlib.contextmanager
    def armed(self, seconds: float, deadline: str) -> Iterator[None]:
        """Check ``CLOSE_MARGIN_S`` after ``seconds`` unless the block ended first. One watch
        thread keeps the session's armed deadlines (each lane's drain, ``close``, ``post_close``)
        from the first until none is armed, so no thread outlives the blocks."""
        if seconds == float("inf"):
            yield
            return
        token = next(self._tokens)
        with self._changed:
            self._armed[token] = (time.monotonic() + seconds + CLOSE_MARGIN_S, deadline)
            if self._thread is None and self.refused is None:
                watcher = threading.Thread(
                    target=self._watch, name="trainbus-loop-watch", daemon=True
                )
                try:  # refused: the block runs unwatched, the session raises at its end
                    self._thread = start_thread(watcher, needed=_WATCH_ROLE)
                except ThreadStartError as exc:
                    self.refused = exc
            self._changed.notify()
        try:
            yield
        finally:
            with self._changed:
                self._armed.pop(token, None)  # gone already if its deadline was checked
                thread = None if self._armed else self._thread
                self._changed.notify()
            if thread is not None:  # the last block: its thread ends (a check: in CONFIRM_S)
                thread.join(CONFIRM_S + 1.0)

    def _watch(self) -> None:  # the watch thread: check each deadline as it passes
        changed = self._changed
        with changed:
            while self._armed:
                token, (due, deadline) = min(self._armed.items(), key=lambda kv: kv[1][0])
                left = due - time.monotonic()
                if left > 0:
                    changed.wait(left)
                    continue
                del self._armed[token]  # looked at once; its block's end finds it gone
                changed.release()
                try:
                    self.check(deadline)
                finally:
                    changed.acquire()
            self._thread = None


def _runs_user_code(tid: int) -> bool:
    """Whether thread ``tid`` runs code outside the event loop's own wait and machinery."""
    frame = sys._current_frames().get(tid)
    if frame is None:
        return False
    where = frame.f_code.co_filename.replace("\\", "/")
    return not any(part in where for part in _IDLE)
