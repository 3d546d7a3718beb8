"""The watchdog that bounds a preempted run's stop by its deadline (``runtime/preemption.py``).

:class:`~trainbus.runtime.preemption.Preemption` starts one :class:`StopWatchdog` per notice;
its rules (patience, the checkpoint it writes, the handlers it abandons, the last bound) are
told in ``runtime/preemption.py``'s docstring and ``docs/preemption.md``. It sits in a module
of its own beside the notice; it asks its owner for the running fit through :class:`Owner`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from trainbus.bus.session import ABANDON_TIMEOUT
from trainbus.core.exceptions import ThreadStartError
from trainbus.core.threads import start_thread
from trainbus.runtime.stop_report import say as _say

if TYPE_CHECKING:
    from trainbus.bus.engine import Engine
    from trainbus.core.notice import PreemptionNotice
    from trainbus.core.state import State

__all__ = [
    "EXIT_MARGIN",
    "EXIT_RESERVE",
    "FitRun",
    "Owner",
    "SavesOnRequest",
    "StopWatchdog",
    "plan_time",
    "savers",
    "savers_here",
]

#: Seconds before the deadline at which a run that has not stopped is ended.
EXIT_MARGIN = 1.0
#: Seconds the watchdog's plan leaves at the end of the grace period for the process's own
#: exit once ``fit_sync()`` raised: the caller's ``finally`` blocks, then Python tearing torch
#: down (0.2-0.4 s on a quiet 2-core machine, 2-4 s with it loaded 4x; nothing bounds it
#: but the launcher's ``SIGKILL``). At most half the time left at the notice.
EXIT_RESERVE = 2.0


@runtime_checkable
class SavesOnRequest(Protocol):
    """What preemption asks of a callback that takes checkpoints (``CheckpointSaver``).

    ``runtime/`` sits below ``callbacks/``: it asks for these methods, not for the class.
    """

    def request_save(self) -> None:
        """Save at the next checkpoint event, or at ``FIT_END`` (any thread, signal-safe)."""

    def requested_save_captured(self) -> bool:
        """Whether the requested save has been captured (or none was requested)."""

    def save_now(self, state: State, timeout: float) -> Path | None:
        """Capture and write the requested checkpoint from the calling thread."""


def savers(callbacks: Iterable[Any]) -> list[SavesOnRequest]:
    """The callbacks among ``callbacks`` that take checkpoints on request."""
    return [cb for cb in callbacks if isinstance(cb, SavesOnRequest)]


def savers_here(state: State, engine: Engine | None) -> list[SavesOnRequest]:
    """The savers that run on this rank (a rank-zero-only saver: rank 0 alone)."""
    return savers(engine._callbacks() if engine is not None else state.callbacks)


@dataclass
class FitRun:
    """The running ``fit()`` a :class:`Preemption` acts on."""

    state: State
    engine: Engine | None
    patience: float
    distributed: bool
    signals: tuple[int, ...] = ()
    #: Distributed, while the batch this rank stops at depends on the other ranks (the
    #: loop still agrees at its boundaries): savers are asked once the ranks agreed.
    agreeing: bool = False
    #: Distributed: gives every other rank this rank's notice (``PeerNotices.send``).
    send: Callable[[int, float], None] | None = None
    #: The loop published ``FIT_END``: a notice's checkpoint is written at once.
    loop_ended: bool = False
    #: Distributed: the watchdog stopped this rank's bus before the ranks agreed (a stuck
    #: handler here). The batches this rank trains until they agree publish no events (no
    #: handler, no record sees them), so the newest complete batch here is the one it
    #: was held at, whose checkpoint the watchdog wrote: no later one is written.
    silenced: bool = False
    #: Held while a notice's checkpoint is written off the training thread; ``fit()``
    #: waits for it (within the deadline) before it returns.
    saving: threading.RLock = field(default_factory=threading.RLock)


class Owner(Protocol):
    """What the watchdog asks of the :class:`~trainbus.runtime.preemption.Preemption` that
    started it."""

    seconds: float
    exit_code: int
    #: The system refused the watchdog's thread at the last notice (said on stderr).
    watchdog_refused: ThreadStartError | None

    @property
    def running(self) -> FitRun | None:
        """The ``fit()`` the notice acts on, or ``None`` once it returned."""

    def save_requested(self, state: State, fit: FitRun) -> None:
        """Write what the savers were asked for and have not captured (the loop ended)."""

    def leave_report(self) -> None:
        """Leave the stop report before the process is ended (``TRAINBUS_STOP_REPORT``)."""


_WATCHDOG_ROLE = "It bounds a preempted run's stop by the notice's deadline"


class StopWatchdog(threading.Thread):
    """Bounds a preempted run's stop by its deadline when a handler is stuck (module doc)."""

    def __init__(
        self,
        owner: Owner,
        notice: PreemptionNotice,
        state: State,
        engine: Engine,
        patience: float,
    ) -> None:
        super().__init__(name="trainbus-preemption-watchdog", daemon=True)
        self.owner, self.notice, self.state, self.engine = owner, notice, state, engine
        self.patience = patience
        self.started_at = time.monotonic()
        self.deadline = max(self.started_at, notice.deadline - EXIT_MARGIN)
        self.done = threading.Event()  # fit() is returning
        self.raise_now = False  # the main thread's handler raises HandlerAbandoned
        self.main = threading.main_thread().ident
        self._sending = threading.Lock()  # no signal to the main thread once fit() returns
        # The last bound, on a timer of its own: it fires even if this thread is stuck
        # (a callback's state_dict() that waits for the stuck handler, say).
        self._last: threading.Timer | None = None
        if notice.source != "call":  # a call never ends the process (module docstring)
            self._last = threading.Timer(self.deadline - self.started_at, self._exit)
            self._last.daemon = True
            self._last.name = "trainbus-preemption-deadline"

    def start(self) -> None:
        """Start the deadline's timer, then this thread (``bus.threads.start_thread``).

        Refused by the system: neither runs (the timer is cancelled), the stop goes on
        unwatched, and the refusal is said on stderr and kept in ``owner.watchdog_refused``.
        """
        try:
            if self._last is not None:
                start_thread(self._last, needed=_WATCHDOG_ROLE)
            start_thread(self, needed=_WATCHDOG_ROLE, start=super().start)
        except ThreadStartError as exc:
            self.finish()
            self.owner.watchdog_refused = exc
            self._say(f"{exc}; the preemption's stop goes on without it")

    def finish(self) -> None:
        """``fit()`` is returning: nothing more is done, no signal sent."""
        with self._sending:
            self.done.set()
        if self._last is not None:
            self._last.cancel()

    def _say(self, text: str) -> None:
        _say(f"trainbus: {text}")

    def run(self) -> None:
        name = self.notice.reason
        fit = self.owner.running
        if fit is not None and fit.send is not None and self.notice.source != "peer":
            fit.send(self.notice.signum or 0, self.notice.time_left())  # every rank, now
        if fit is not None and fit.loop_ended and not fit.silenced:  # no event comes now
            with fit.saving:  # fit() waits for it; once it is returning, nothing starts
                if not self.done.is_set():
                    self.owner.save_requested(self.state, fit)
        if self.done.wait(self.patience):
            return
        savers = savers_here(self.state, self.engine)
        if fit is not None and fit.agreeing:
            # Distributed, before the ranks agreed: a stuck handler here holds this rank's
            # training thread at a barrier (and every peer in its next collective). The
            # checkpoint of the batch held here is written, then the handler abandoned:
            # this rank goes on without events until the ranks agree one batch later
            # (FitRun.silenced). A training thread that is not held here waits for a
            # peer, whose own watchdog frees it; its savers write the agreed batch.
            if not self.engine._training_thread_held():
                return
            fit.silenced = True
            for saver in savers:
                saver.request_save()
        elif all(s.requested_save_captured() for s in savers):
            # The checkpoint is taken (or there is none to take: without a saver nothing
            # tells a stuck run from one still closing): only the last bound applies.
            return
        waiting = self.engine._describe_waiting()
        late = self.started_at >= self.notice.deadline - EXIT_MARGIN
        within = (
            "before its deadline, which had already passed when the notice came"
            if late
            else f"within {self.patience:.1f} s"
        )
        if waiting:
            self._say(
                f"{name}: the run did not reach its checkpoint {within}; abandoning the "
                f"stuck handler(s) {waiting}, writing the checkpoint now and closing the "
                "other callbacks"
            )
        else:
            self._say(
                f"{name}: the run did not reach its checkpoint {within}; writing the "
                "checkpoint now and closing the callbacks"
            )
        for saver in savers:
            try:
                path = saver.save_now(self.state, max(0.0, self.deadline - time.monotonic()))
            except Exception as exc:  # reported; the exit below still comes in time
                self._say(f"{name}: the checkpoint could not be written: {exc!r}")
            else:
                if path is not None:
                    self._say(f"{name}: checkpoint written to {str(path)!r}")
        left = plan_time(self.notice.time_left())  # the abandoned get at most half of it
        self.engine._abandon(f"{name}'s forced stop", min(ABANDON_TIMEOUT, max(0.1, left / 2)))
        if self.done.wait(min(ABANDON_TIMEOUT, max(0.0, left) / 2)):
            return
        fit = self.owner.running
        signum = self.notice.signum
        if signum is None or fit is None or signum not in fit.signals:
            return  # only our own signal handler can interrupt the main thread
        with self._sending:
            if not self.done.is_set() and self._loop_wedged():
                self._say(f"{name}: the event loop is blocked by {waiting}; interrupting it")
                self.raise_now = True
                signal.pthread_kill(self.main or 0, signum)

    def _loop_wedged(self) -> bool:
        """Whether the main thread runs user code, not the event loop's wait for I/O."""
        frame = sys._current_frames().get(self.main or 0)
        if frame is None:
            return False
        where = frame.f_code.co_filename.replace("\\", "/")
        idle = ("/selectors.py", "/asyncio/", "/trio/", "/anyio/", "/threading.py")
        return not any(part in where for part in idle)

    def _exit(self) -> None:
        if self.done.is_set():
            return
        waiting = self.engine._describe_waiting()
        self._say(
            f"{self.notice.reason}: the deadline ({self.owner.seconds:g}s grace) is almost "
            f"over and fit() has not returned (still running: {waiting or 'closing'}); "
            f"exiting with status {self.owner.exit_code} now"
        )
        self.owner.leave_report()
        os._exit(self.owner.exit_code)


def plan_time(left: float) -> float:
    """The seconds the watchdog plans with when ``left`` remain: the grace period less the
    process's exit (:data:`EXIT_RESERVE`, at most half of ``left``)."""
    return left - min(EXIT_RESERVE, left / 2)
