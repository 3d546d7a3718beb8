"""The gate: what the training thread and the lanes' runners share for one session.

The producer (the training thread) waits here: for lanes to finish what a barrier or a full
queue waits for, and for a lane to be handed over so it can run a plain ``@blocking``
handler itself. Runners, on any thread, tell the gate when a lane reached what the producer
waits for, and report handler failures here; anyone may stop the session. The drivers
depend on the gate, never on the bus.

Invariant: ``_waiting`` holds the lanes the producer waits for right now; it is changed
only under ``_lock``, and ``_signal`` gets one ``True`` when it empties (the producer takes
exactly one signal per wait) or a ``False`` from :meth:`stop`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import TYPE_CHECKING, Literal

from trainbus.bus._stopped import Stopped

if TYPE_CHECKING:
    from trainbus.bus._lane import Lane
    from trainbus.bus._statistics import Counters
    from trainbus.core.callback import Handler
    from trainbus.core.events import Event

__all__ = ["Gate"]

_perf = time.perf_counter

WaitKind = Literal["barrier", "backpressure", "records", "blocking"]


class Gate:
    """Waits of the producer, failures and stopping, for one session."""

    def __init__(self, counters: Counters) -> None:
        self._lock = threading.Lock()
        self._signal: SimpleQueue[bool] = SimpleQueue()
        self._waiting: set[Lane] = set()
        self.counters = counters
        #: Set once; then the producer unwinds at its next event or wait (``Stopped``).
        self.stopping = False
        self.errors: list[BaseException] = []
        #: The lane whose arrival ended the last wait (charged with that wait).
        self._last: Lane | None = None
        #: Seconds one wait may last before ``on_long_wait`` is told (once per wait).
        self.wait_warning = math.inf
        #: Told ``(kind, event, lanes, seconds)`` when a wait passes ``wait_warning``.
        self.on_long_wait: Callable[[WaitKind, Event | None, list[Lane], float], None] | None
        self.on_long_wait = None

    # -- producer --------------------------------------------------------------------------

    def wait(
        self, targets: list[tuple[Lane, int]], kind: WaitKind, event: Event | None = None
    ) -> None:
        """Block until each lane's ``done`` (``log_done`` for ``records``) reaches its target.

        Raises:
            Stopped: The session is stopping.
        """
        logs = kind == "records"
        with self._lock:
            for lane, target in targets:
                if logs:
                    lane.wait_log = target
                    behind = lane.log_done < target
                else:
                    lane.wait_done = target
                    behind = lane.done < target
                if behind:
                    self._waiting.add(lane)
            if not self._waiting:
                for lane, _ in targets:
                    lane.wait_done = lane.wait_log = None
                return
        try:
            self._block(kind, event)
        finally:
            with self._lock:
                for lane, _ in targets:
                    lane.wait_done = lane.wait_log = None
                self._waiting.clear()

    def claim(self, lane: Lane, event: Event | None = None) -> None:
        """Claim ``lane`` for this thread, waiting for its driver to hand it over.

        Raises:
            Stopped: The session is stopping (the lane is not claimed then).
        """
        with self._lock:
            self._waiting.add(lane)
        if lane.claim_or_ask():
            with self._lock:
                self._waiting.discard(lane)
            return
        try:
            self._block("blocking", event)
        except BaseException:
            lane.withdraw_claim()
            raise
        finally:
            with self._lock:
                self._waiting.clear()

    def _block(self, kind: WaitKind, event: Event | None = None) -> None:
        t0 = _perf()
        after = self.wait_warning
        if after == math.inf or self.on_long_wait is None:
            self._signal.get()
        else:
            try:
                self._signal.get(timeout=after)
            except Empty:
                with self._lock:
                    lanes = sorted(self._waiting, key=lambda lane: lane.index)
                self.on_long_wait(kind, event, lanes, after)
                self._signal.get()
        elapsed = _perf() - t0
        self.counters.waited(kind, t0, elapsed)
        last, self._last = self._last, None
        if last is not None:
            last.member.wait_caused += elapsed
        if self.stopping:
            raise Stopped

    # -- runners (any thread) --------------------------------------------------------------

    def reached(self, lane: Lane) -> None:
        """``lane`` reached what the producer waits for (or was handed over)."""
        with self._lock:
            if lane in self._waiting:
                self._waiting.discard(lane)
                if not self._waiting:
                    self._last = lane
                    self._signal.put(True)

    def fail(
        self,
        exc: BaseException,
        handler: Handler | None,
        event: Event | None,
        lane: Lane | None = None,
    ) -> None:
        """Record a handler's exception and stop the producer at its next event.

        ``lane``, the failed handler's lane, runs nothing more but its close (D10).
        """
        if lane is not None:
            lane.failed = True
        if handler is not None:
            _start_at_user_code(exc)
            where = f"Event.{event.name}" if event is not None else "a logged record"
            if handler.qualname.endswith(".background"):
                where = "its background task"
            exc.add_note(f"raised by {handler.qualname} while handling {where}")
        with self._lock:
            self.errors.append(exc)
        self.stop()

    def stop(self) -> None:
        """Stop the producer at its next event or wait. Safe from any thread."""
        self.stopping = True
        self._signal.put(False)


#: trainbus's own source folder: frames from here are the bus's, not the user's.
_OURS = str(Path(__file__).resolve().parents[1])


def _start_at_user_code(exc: BaseException) -> None:
    """Drop the bus's own frames from the start of a handler error's traceback, so that
    (below the frames ``fit()`` adds as it re-raises) it starts at the user's handler."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_OURS):
        tb = tb.tb_next
    if tb is not None:  # an error of the bus itself keeps its whole traceback
        exc.__traceback__ = tb
