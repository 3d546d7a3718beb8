"""Preemption: on SIGTERM, stop at the next batch, checkpoint, deliver, and exit with a status.

Clusters announce the end of a job with a signal, then kill it some seconds later: SLURM
sends ``SIGTERM`` (or the signal named by ``sbatch --signal=TERM@120``), Kubernetes
``SIGTERM`` then ``SIGKILL`` after ``terminationGracePeriodSeconds``. With
``Trainer(preemption=True)`` (or a :class:`Preemption`), ``fit()`` installs a handler for
those signals while it runs (in the main thread only: Python delivers signals there). The
handler only sets flags, which is all a signal handler may safely do:

1. every :class:`~trainbus.callbacks.CheckpointSaver` is asked to save at its next
   checkpoint event, or at ``FIT_END`` (:meth:`CheckpointSaver.request_save`);
2. every callback with a ``close_timeout`` (the HTTP uploader, MLflow) has it lowered so
   that ``close`` ends within ``grace`` seconds of the signal: what is not delivered by
   then stays in the spool or journal, for the resumed run;
3. ``state.stop_training()``: the loop stops at the next batch boundary, fires
   ``FIT_END`` and closes every callback as usual.

``fit_sync()`` then raises :class:`TrainingPreempted`, a ``SystemExit`` whose code is
``exit_code`` (143 = 128 + SIGTERM by default): a script that does not catch it exits
with that status, which a job script can test to requeue the job (see
``docs/crash-consistency.md``). ``await trainer.fit()`` returns normally instead and
``trainer.preempted`` tells the caller. SIGINT is not handled here.

**A stuck handler.** The steps above need the training thread to reach the next batch
boundary; a handler that blocks (the barrier at ``BATCH_END`` waits for it) would hold it
there past the cluster's ``SIGKILL``. So the signal also starts a watchdog thread
(:class:`_Watchdog`), bounded by ``grace`` from the signal:

- after ``patience`` seconds (the Trainer's ``close_timeout``, at most ``grace / 2``)
  without the requested checkpoint captured (in a run with a ``CheckpointSaver``;
  without one only the last bound below applies), it names on stderr what the run waits
  for (the stuck callback and event), captures and writes the checkpoint itself
  (:meth:`CheckpointSaver.save_now`: the training thread is held at the barrier, its
  state consistent as of the batch it finished), then gives what still runs 2 s more and
  abandons it (``Engine._abandon``, as a second Ctrl-C does: threads left behind as
  daemons, coroutines cancelled) so that every other callback closes under its deadline;
- a handler that blocks the event loop's own thread (``time.sleep`` inside ``async def``)
  cannot be cancelled from the loop; when the loop runs on the main thread (``fit_sync()``,
  ``anyio.run(trainer.fit)``) the watchdog re-sends the signal to the main thread, whose
  handler then raises :class:`HandlerAbandoned` inside the stuck handler (as Ctrl-C
  raises ``KeyboardInterrupt``), which frees the loop; ``fit()`` drops that error;
- one second before ``grace`` ends, if ``fit()`` still has not returned, it writes what
  it could not finish to stderr and ends the process with ``os._exit(exit_code)``
  (callbacks' ``close`` that did not run by then do not run).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainbus.bus.engine import Engine
    from trainbus.core.state import State

__all__ = ["HandlerAbandoned", "Preemption", "TrainingPreempted", "check_preemption"]

#: Seconds before the end of ``grace`` at which a run that has not stopped is ended.
EXIT_MARGIN = 1.0


class HandlerAbandoned(Exception):
    """Raised inside a handler that blocked the event loop past preemption's patience."""


class TrainingPreempted(SystemExit):
    """Raised by ``fit_sync()`` after a preemption signal stopped and checkpointed the run.

    A ``SystemExit``: uncaught, the process exits with :attr:`code` and no traceback.
    """


@dataclass
class Preemption:
    """What ``fit()`` does when the cluster signals that the job will be stopped.

    Args:
        signals: The signals that mean "stop soon"; default ``(SIGTERM,)``. ``SIGINT``
            is refused (Ctrl-C is handled by ``fit_sync`` itself).
        exit_code: The status ``fit_sync()`` exits with (via :class:`TrainingPreempted`)
            once the run stopped; default 143 (128 + SIGTERM, what a shell reports for a
            process ended by SIGTERM).
        grace: Seconds after the signal by which loggers' ``close`` must end (their
            ``close_timeout`` is lowered to fit); keep it below the cluster's delay
            before ``SIGKILL`` minus a batch and a checkpoint write.

    Attributes:
        signum: The signal received, or ``None``.

    Example:
        >>> trainer = Trainer(model, loader, "10ep", callbacks=[CheckpointSaver("ckpt")],
        ...                   load_path="ckpt", preemption=Preemption(grace=20))
        >>> trainer.fit_sync()   # on SIGTERM: checkpoint, deliver, exit(143)
    """

    signals: tuple[int, ...] = (signal.SIGTERM,)
    exit_code: int = 143
    grace: float = 30.0
    signum: int | None = field(default=None, init=False)
    _watchdog: _Watchdog | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.signals, int | signal.Signals):
            self.signals = (self.signals,)
        sigs = tuple(self.signals)
        if not sigs or not all(isinstance(s, int) for s in sigs):
            raise TypeError(
                f"signals={self.signals!r} must be a tuple of signal numbers, e.g. "
                "(signal.SIGTERM,) or (signal.SIGUSR1,)"
            )
        if signal.SIGINT in sigs:
            raise ValueError(
                "signals must not include SIGINT: Ctrl-C is handled by fit_sync() itself; "
                "pass (signal.SIGTERM,) or (signal.SIGUSR1,)"
            )
        self.signals = sigs
        if isinstance(self.exit_code, bool) or not isinstance(self.exit_code, int):
            raise TypeError(f"exit_code={self.exit_code!r} must be an int, e.g. 143")
        if not 0 <= self.exit_code <= 255:
            raise ValueError(f"exit_code={self.exit_code!r} must be in 0..255, e.g. 143")
        if isinstance(self.grace, bool) or not isinstance(self.grace, int | float) or not (
            self.grace > 0
        ):
            raise ValueError(f"grace={self.grace!r} must be seconds > 0, e.g. 30.0")

    def trigger(
        self, state: State, signum: int, engine: Engine | None = None, patience: float = 0.0
    ) -> None:
        """Ask the savers for a checkpoint, bound the loggers' close, stop training; with
        an ``engine``, start the watchdog (module docstring) that bounds it all by ``grace``."""
        from trainbus.callbacks.checkpoint_saver import CheckpointSaver

        if self.signum is not None:
            watchdog = self._watchdog
            if watchdog is not None and watchdog.raise_now:  # the watchdog's own signal
                watchdog.raise_now = False
                raise HandlerAbandoned(
                    f"abandoned: it blocked the event loop after {signal.Signals(signum).name}"
                )
            return  # already stopping
        self.signum = signum
        for cb in state.callbacks:
            if isinstance(cb, CheckpointSaver):
                cb.request_save()
        _bound_close(state.callbacks, self.grace)
        state.stop_training()
        if engine is not None:
            patience = min(patience, self.grace / 2) if patience > 0 else self.grace / 2
            self._watchdog = _Watchdog(self, state, engine, patience, signum)
            self._watchdog.start()

    @contextmanager
    def installed(
        self, state: State, engine: Engine | None = None, patience: float = 0.0
    ) -> Iterator[None]:
        """Handle :attr:`signals` during the block (only in the main thread).

        With ``engine``, a signal also starts the watchdog that bounds the stop by
        ``grace`` (``patience``: seconds to wait for the checkpoint before the stuck
        handlers are abandoned; the Trainer passes its ``close_timeout``).
        """
        self.signum = None
        self._watchdog = None
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, frame: FrameType | None) -> None:
            self.trigger(state, signum, engine, patience)

        previous = {s: signal.signal(s, handler) for s in self.signals}
        try:
            yield
        finally:
            watchdog = self._watchdog
            if watchdog is not None:
                watchdog.finish()  # first: it sends no signal after this
            for s, old in previous.items():
                signal.signal(s, old)
            self._watchdog = None

    def raise_if_triggered(self) -> None:
        """Raise :class:`TrainingPreempted` if a signal stopped the run."""
        if self.signum is not None:
            raise _preempted(self.exit_code, signal.Signals(self.signum).name)


def _preempted(code: int, name: str) -> TrainingPreempted:
    exc = TrainingPreempted(code)
    exc.add_note(f"trainbus: {name} received; the run stopped after a checkpoint")
    return exc


class _Watchdog(threading.Thread):
    """Bounds a preempted run's stop by ``grace`` when a handler is stuck (module docstring)."""

    def __init__(
        self, owner: Preemption, state: State, engine: Engine, patience: float, signum: int
    ) -> None:
        super().__init__(name="trainbus-preemption-watchdog", daemon=True)
        self.owner, self.state, self.engine = owner, state, engine
        self.patience, self.signum = patience, signum
        self.started_at = time.monotonic()
        self.deadline = self.started_at + max(0.0, owner.grace - EXIT_MARGIN)
        self.done = threading.Event()  # fit() is returning
        self.raise_now = False  # the main thread's handler raises HandlerAbandoned
        self.main = threading.main_thread().ident
        self._sending = threading.Lock()  # no signal to the main thread once fit() returns
        # The last bound, on a timer of its own: it fires even if this thread is stuck
        # (a callback's state_dict() that waits for the stuck handler, say).
        self._last = threading.Timer(self.deadline - self.started_at, self._exit)
        self._last.daemon = True
        self._last.name = "trainbus-preemption-deadline"

    def start(self) -> None:
        self._last.start()
        super().start()

    def finish(self) -> None:
        with self._sending:
            self.done.set()
        self._last.cancel()

    def _say(self, text: str) -> None:
        print(f"trainbus: {text}", file=sys.stderr, flush=True)

    def _savers(self) -> list[Any]:
        from trainbus.callbacks.checkpoint_saver import CheckpointSaver

        return [cb for cb in self.state.callbacks if isinstance(cb, CheckpointSaver)]

    def run(self) -> None:
        name = signal.Signals(self.signum).name
        if self.done.wait(self.patience):
            return
        savers = self._savers()
        if all(s.requested_save_captured() for s in savers):
            # The checkpoint is taken (or there is none to take: without a saver nothing
            # tells a stuck run from one still closing): only the last bound applies.
            return
        waiting = self.engine._describe_waiting() or "a handler"
        self._say(
            f"{name}: the run did not reach its checkpoint within {self.patience:g}s; "
            f"abandoning the stuck handler(s) {waiting}, writing the checkpoint now and "
            "closing the other callbacks"
        )
        for saver in savers:
            try:
                path = saver.save_now(self.state, max(0.0, self.deadline - time.monotonic()))
            except Exception as exc:  # reported; the exit below still comes in time
                self._say(f"{name}: the checkpoint could not be written: {exc!r}")
            else:
                if path is not None:
                    self._say(f"{name}: checkpoint written to {str(path)!r}")
        self.engine._abandon()
        if self.done.wait(min(2.0, max(0.0, self.deadline - time.monotonic()) / 2)):
            return
        with self._sending:
            if not self.done.is_set() and self._loop_wedged():
                self._say(f"{name}: the event loop is blocked by {waiting}; interrupting it")
                self.raise_now = True
                signal.pthread_kill(self.main or 0, self.signum)

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
        name = signal.Signals(self.signum).name
        waiting = self.engine._describe_waiting()
        self._say(
            f"{name}: grace={self.owner.grace:g}s is almost over and fit() has not returned "
            f"(still running: {waiting or 'closing'}); exiting with status "
            f"{self.owner.exit_code} now"
        )
        os._exit(self.owner.exit_code)


def _bound_close(callbacks: Iterable[Any], grace: float) -> None:
    for cb in callbacks:
        timeout = getattr(cb, "close_timeout", None)
        if isinstance(timeout, float) and timeout > grace:
            cb.close_timeout = grace


def check_preemption(value: Any) -> Preemption | None:
    """``Trainer(preemption=...)``: ``False``/``None``, ``True`` or a :class:`Preemption`."""
    if value is None or value is False:
        return None
    if value is True:
        return Preemption()
    if isinstance(value, Preemption):
        return value
    raise TypeError(
        f"preemption={value!r} must be True, False or a trainbus.Preemption(...), e.g. "
        "preemption=True to checkpoint and exit on SIGTERM"
    )
