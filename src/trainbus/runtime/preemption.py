"""Preemption: one notice with a deadline, from a signal or a call; stop, checkpoint, exit.

Clusters announce the end of a job, then kill it some seconds later: torchrun forwards
``SIGTERM`` and sends ``SIGKILL`` after its shutdown timeout, SLURM sends the signal named
by ``sbatch --signal=USR1@90``, Kubernetes ``SIGTERM`` then ``SIGKILL`` after
``terminationGracePeriodSeconds``; a service or a spot-notice poller calls
``trainer.preempt(reason)``; a callback that learns of one from its cluster (``RayReporter``:
Ray's drain notice) announces it (:class:`AnnouncesPreemption`), and the training loop gives
it at the next batch boundary (:meth:`Preemption.poll`). Every source gives the same notice
(:meth:`Preemption.give`):

1. ``state.preemption`` becomes a :class:`~trainbus.core.notice.PreemptionNotice`
   (``reason``, ``deadline``, ``time_left()``), visible to every handler at once, and each
   callback's ``async def preemption_notice(state, logger)`` starts as a task on the loop
   (``Engine._notify_preemption``), beside whatever handler its callback runs;
2. in a single process every checkpoint taker (:class:`SavesOnRequest`, e.g.
   ``CheckpointSaver``) is asked to save at its next checkpoint event, or at ``FIT_END``;
   under ``torchrun`` the notice also goes to every other rank at once
   (:class:`~trainbus.runtime.peer_notices.PeerNotices`, through the process group's
   store), and the savers are asked once every rank agreed to stop
   (``runtime/distributed.py``, :class:`~trainbus.runtime.distributed.StopAgreement`), so
   that the checkpoint is of the batch every rank stopped at (or at once, as in one
   process, once the stop batch no longer depends on the other ranks:
   :meth:`Preemption.stop_fixed`). A notice once the loop published ``FIT_END`` (while the
   callbacks close) has its checkpoint written at once (:meth:`Preemption.loop_ended`);
   a ``fit()`` that trained no batch has nothing to save;
3. every callback with a ``close_timeout`` (the HTTP uploader, MLflow) has it lowered so
   that ``close`` ends before the deadline: what is not delivered by then stays in the
   spool or journal, for the resumed run;
4. ``state.stop_training()``: the loop stops at the next batch boundary (one batch later
   under ``torchrun``, where the ranks agree), fires ``FIT_END`` and closes every callback.

``fit_sync()`` then raises :class:`TrainingPreempted`, a ``SystemExit`` whose code is
``exit_code`` (143 = 128 + SIGTERM by default). ``await trainer.fit()`` returns normally and
``trainer.preempted`` tells the caller. SIGINT is not handled here.

**The deadline** is ``grace`` seconds after the notice (or the ``deadline`` given to
``trainer.preempt``). ``grace`` defaults from the environment (:func:`default_grace`):
``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` (torchrun's delay before ``SIGKILL``), else
``TRAINBUS_PREEMPTION_GRACE`` (set it beside SLURM's ``--signal`` or Kubernetes'
``terminationGracePeriodSeconds``), else 30 s.

**A stuck handler.** The steps above need the training thread to reach the next batch
boundary; a handler that blocks (the barrier at ``BATCH_END`` waits for it) would hold it
there past the cluster's ``SIGKILL``. So the notice also starts a watchdog thread
(:class:`StopWatchdog`), bounded by the deadline:

- after ``patience`` seconds (the Trainer's ``close_timeout``, at most half the time left)
  without the requested checkpoint captured (in a run with a ``CheckpointSaver``;
  without one only the last bound below applies), it names on stderr what the run waits
  for (the stuck callback and event), captures and writes the checkpoint itself
  (:meth:`SavesOnRequest.save_now`: the training thread is held at the barrier, its
  state consistent as of the batch it finished), then gives what still runs 2 s more and
  abandons it (``Engine._abandon``, as a second Ctrl-C does: threads left behind as
  daemons, coroutines cancelled) so that every other callback closes under its deadline;
- under ``torchrun``, before the ranks agreed, the watchdog of the rank whose training
  thread is held at a barrier by its own stuck handler writes the checkpoint of the batch
  it is held at (the saver's rank), then abandons the handler; that rank trains on without
  events (no handler and no record sees those batches: ``FitRun.silenced``) until the
  ranks agree one batch later, and writes no later checkpoint. A rank whose training
  thread waits in a collective for such a peer does nothing: the peer's watchdog frees
  it, and its savers write the agreed batch;
- a handler that blocks the event loop's own thread (``time.sleep`` inside ``async def``)
  cannot be cancelled from the loop; for a signal's notice, when the loop runs on the main
  thread (``fit_sync()``, ``anyio.run(trainer.fit)``) the watchdog re-sends the signal to
  the main thread, whose handler then raises :class:`HandlerAbandoned` inside the stuck
  handler (as Ctrl-C raises ``KeyboardInterrupt``), which frees the loop; ``fit()`` drops
  that error;
- one second before the deadline, if ``fit()`` still has not returned and the notice came
  from a signal (here or on another rank: the process is about to be killed anyway), it
  writes what it could not finish to stderr and ends the process with
  ``os._exit(exit_code)``, after the stop report. A notice from ``trainer.preempt()``
  never ends the process (a service that calls it keeps running).

**The exit.** Every rank that stopped for a preemption exits with ``exit_code``: once
``fit_sync()`` raised, a further ``SIGTERM`` (torchrun sends one to the workers still running
once one has exited) ends the process at once with that status, and from the process's
exit on it is ignored (:meth:`Preemption.raise_if_triggered`). With
``TRAINBUS_STOP_REPORT`` set, each such rank leaves a small JSON report
(``runtime/stop_report.py``), which a job script reads to tell a preemption from a crash
(torchrun's own status is 1 in both cases).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from trainbus.core.exceptions import HandlerAbandoned, ThreadStartError, TrainingPreempted
from trainbus.core.notice import NoticeSource, PreemptionNotice
from trainbus.runtime.stop_report import say as _say
from trainbus.runtime.stop_report import stop_summary, write_report
from trainbus.runtime.stop_watchdog import (
    EXIT_MARGIN,
    EXIT_RESERVE,
    FitRun,
    SavesOnRequest,
    StopWatchdog,
    plan_time,
    savers,
    savers_here,
)

if TYPE_CHECKING:
    from trainbus.bus.engine import Engine
    from trainbus.core.state import State

__all__ = [
    "EXIT_MARGIN",
    "EXIT_RESERVE",
    "AnnouncesPreemption",
    "DEFAULT_GRACE",
    "GRACE_ENV",
    "HandlerAbandoned",
    "Preemption",
    "SavesOnRequest",
    "TrainingPreempted",
    "check_preemption",
    "default_grace",
]

#: The grace period when neither the argument nor the environment gives one.
DEFAULT_GRACE = 30.0
#: Our variable for the grace period (SLURM, Kubernetes: the delay is set outside).
GRACE_ENV = "TRAINBUS_PREEMPTION_GRACE"
#: torchrun's delay between its SIGTERM and its SIGKILL, when given through the environment.
TORCHRUN_GRACE_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"



def _env_seconds(environ: Mapping[str, str], name: str) -> float | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(
            f"environment variable {name}={raw!r} must be a number of seconds > 0, e.g. {name}=120"
        )
    return value


def default_grace(environ: Mapping[str, str] | None = None) -> tuple[float, str]:
    """The grace period a ``Preemption()`` without ``grace=`` uses, and where it came from.

    ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` (torchrun's delay before ``SIGKILL``; torchrun's
    ``--shutdown-timeout`` flag is not visible to the workers, the variable is), else
    ``TRAINBUS_PREEMPTION_GRACE``, else 30 s.

    Raises:
        ValueError: One of the variables is set but is not a number of seconds > 0.

    Example:
        >>> default_grace({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "120"})
        (120.0, 'TORCH_ELASTIC_SHUTDOWN_TIMEOUT')
        >>> default_grace({})
        (30.0, 'default')
    """
    env = os.environ if environ is None else environ
    for name in (TORCHRUN_GRACE_ENV, GRACE_ENV):
        seconds = _env_seconds(env, name)
        if seconds is not None:
            return seconds, name
    return DEFAULT_GRACE, "default"


@runtime_checkable
class AnnouncesPreemption(Protocol):
    """A callback that learns of a preemption outside trainbus (``RayReporter``: Ray's drain).

    The training loop asks it at each batch boundary, on the training thread, while the run
    has no notice (:meth:`Preemption.poll`); what it returns becomes the notice, as if
    ``trainer.preempt(reason, deadline=deadline)`` had been called there. It is asked at
    every batch: it must be cheap (an attribute read) and must not block.
    """

    def pending_preemption(self) -> tuple[str, float | None] | None:
        """``(reason, deadline)`` once a preemption was announced (``deadline``: a
        :func:`time.monotonic` value, or ``None`` for the grace period), else ``None``."""


def announcers(callbacks: Iterable[Any]) -> list[AnnouncesPreemption]:
    """The callbacks the training loop asks for a preemption at each batch boundary."""
    return [cb for cb in callbacks if isinstance(cb, AnnouncesPreemption)]


@dataclass
class Preemption:
    """What ``fit()`` does when the job is told that it will be stopped.

    Args:
        signals: The signals that give the notice; default ``(SIGTERM,)`` (SLURM's
            ``--signal=USR1@90``: ``(signal.SIGUSR1,)``; ``()``: only
            ``trainer.preempt()``). ``SIGINT`` is refused (Ctrl-C is handled by
            ``fit_sync`` itself).
        exit_code: The status ``fit_sync()`` exits with (via :class:`TrainingPreempted`)
            once the run stopped; default 143 (128 + SIGTERM, what a shell reports for a
            process ended by SIGTERM).
        grace: Seconds from the notice to its deadline, by which the run must have
            checkpointed and closed; ``None`` (the default) takes it from the
            environment (:func:`default_grace`: ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, else
            ``TRAINBUS_PREEMPTION_GRACE``, else 30 s).

    Attributes:
        signum: The signal that gave the last notice, or ``None``.
        seconds: The grace period in use (``grace``, or the environment's).
        seconds_from: Where :attr:`seconds` came from: ``"grace="``, a variable's name,
            or ``"default"``.

    Example:
        >>> trainer = Trainer(model, loader, "10ep", callbacks=[CheckpointSaver("ckpt")],
        ...                   load_path="ckpt", preemption=Preemption(grace=20))
        >>> trainer.fit_sync()   # on SIGTERM: checkpoint, deliver, exit(143)
    """

    signals: tuple[int, ...] = (signal.SIGTERM,)
    exit_code: int = 143
    grace: float | None = None
    signum: int | None = field(default=None, init=False)
    seconds: float = field(default=DEFAULT_GRACE, init=False)
    seconds_from: str = field(default="default", init=False)
    _watchdog: StopWatchdog | None = field(default=None, init=False, repr=False)
    #: The system refused the watchdog's thread at the last notice (said on stderr).
    watchdog_refused: ThreadStartError | None = field(default=None, init=False, repr=False)
    _fit: FitRun | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.signals, int | signal.Signals):
            self.signals = (self.signals,)
        sigs = tuple(self.signals)
        if not all(isinstance(s, int) for s in sigs):
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
        if self.grace is None:
            self.seconds, self.seconds_from = default_grace()
            return
        if (
            isinstance(self.grace, bool)
            or not isinstance(self.grace, int | float)
            or not (self.grace > 0)
        ):
            raise ValueError(
                f"grace={self.grace!r} must be seconds > 0, e.g. 30.0 (or None: from "
                f"{TORCHRUN_GRACE_ENV} or {GRACE_ENV})"
            )
        self.seconds, self.seconds_from = float(self.grace), "grace="

    # -- the notice ---------------------------------------------------------------------------

    def notice(
        self,
        reason: str,
        *,
        source: NoticeSource = "call",
        deadline: float | None = None,
        signum: int | None = None,
    ) -> PreemptionNotice:
        """A notice given now: its deadline is ``deadline``, or :attr:`seconds` from now."""
        when = time.monotonic() + self.seconds if deadline is None else float(deadline)
        return PreemptionNotice(reason=reason, deadline=when, source=source, signum=signum)

    def give(self, state: State, notice: PreemptionNotice) -> bool:
        """Give ``notice`` to the run (any thread, a signal handler, a task on the loop).

        The first notice wins; later ones (another signal, a second ``preempt()``) are
        dropped and this returns ``False``. Outside ``fit()`` the notice waits for the next
        ``fit()``, which then stops at its first batch boundary.
        """
        if not self._lock.acquire(blocking=False):
            return False  # another notice is being given right now: it wins
        try:
            if state.preemption is not None:
                return False
            state.preemption = notice
            if notice.signum is not None:
                self.signum = notice.signum
        finally:
            self._lock.release()
        fit = self._fit
        if fit is not None:
            self._act(fit, notice)
        else:
            state.stop_training()
        return True

    def poll(self, state: State, sources: Sequence[AnnouncesPreemption]) -> None:
        """Give the notice the first of ``sources`` announces (the training loop, training
        thread, at each batch boundary while ``state.preemption`` is ``None``).

        Given at a boundary, the notice stops a single process there; in a distributed run
        its flag goes into that boundary's stop agreement and every rank stops one batch
        later (``training/rank_stops.py``).
        """
        for source in sources:
            pending = source.pending_preemption()
            if pending is not None:
                reason, deadline = pending
                self.give(state, self.notice(reason, deadline=deadline))
                return

    def _act(self, fit: FitRun, notice: PreemptionNotice) -> None:
        state = fit.state
        if not fit.agreeing:  # distributed: asked once the ranks agreed (module doc)
            for saver in savers_here(state, fit.engine):
                saver.request_save()
        _bound_close(state.callbacks, max(0.1, notice.time_left() - 2 * EXIT_MARGIN))
        state.stop_training()
        if fit.engine is not None:
            fit.engine._notify_preemption()
            left = plan_time(notice.time_left())
            patience = min(fit.patience, left / 2) if fit.patience > 0 else left / 2
            self._watchdog = StopWatchdog(self, notice, state, fit.engine, patience)
            self._watchdog.start()

    def agreed(self, state: State, *, signum: int) -> None:
        """Every rank agreed to stop for a preemption (``StopAgreement``, training thread):
        give this rank the notice if it has none, and ask its savers for a checkpoint now,
        so that it is of the batch every rank stops at (``FIT_END`` writes it)."""
        if state.preemption is None:
            self.from_peer(state, signum)
        self.stop_fixed(state)

    def from_peer(self, state: State, signum: int, seconds_left: float | None = None) -> None:
        """Another rank had a notice (``signum``: its signal, or 0): give this rank one
        (``source="peer"``) whose deadline is the peer's (``seconds_left`` from now), or the
        grace period when not known. Any thread (the agreement's, or ``PeerNotices``')."""
        name = signal.Signals(signum).name if signum else ""
        reason = f"{name} on another rank" if name else "preempted on another rank"
        deadline = None if seconds_left is None else time.monotonic() + seconds_left
        self.give(state, self.notice(reason, source="peer", deadline=deadline,
                                     signum=signum or None))  # fmt: skip

    def stop_fixed(self, state: State) -> None:
        """The batch this rank stops at no longer depends on the other ranks (the ranks
        agreed, or the loop passed its last boundary; training thread): a notice from now
        on asks the savers at once, as in one process, and one given already does now."""
        fit = self._fit
        if fit is None or not fit.agreeing:
            return
        fit.agreeing = False
        if state.preemption is not None and not fit.silenced:
            for saver in savers_here(state, fit.engine):
                saver.request_save()

    def loop_ended(self, state: State) -> None:
        """The training loop published ``FIT_END`` (training thread): no checkpoint event
        comes any more, and the state is the last batch's for good. A notice's save still
        requested is written now, here; one given later is written by the watchdog at once
        (a notice while the callbacks close)."""
        fit = self._fit
        if fit is None:
            return
        fit.loop_ended = True
        self.stop_fixed(state)
        if state.preemption is not None and not fit.silenced:
            self.save_requested(state, fit)

    def save_requested(self, state: State, fit: FitRun) -> None:
        """Write what the savers were asked for and have not captured (the loop ended)."""
        with fit.saving:
            for saver in savers_here(state, fit.engine):
                if saver.requested_save_captured():
                    continue
                notice = state.preemption
                left = plan_time(notice.time_left()) if notice is not None else 0.0
                try:
                    path = saver.save_now(state, max(0.0, left))
                except Exception as exc:  # reported; the stop goes on
                    _say(f"trainbus: the checkpoint could not be written: {exc!r}")
                else:
                    if path is not None:
                        _say(f"trainbus: checkpoint written to {str(path)!r}")

    @property
    def running(self) -> FitRun | None:
        """The ``fit()`` notices act on now, or ``None`` (for the watchdog)."""
        return self._fit

    def leave_report(self) -> None:
        """Leave the stop report (``TRAINBUS_STOP_REPORT``) for the running fit's notice."""
        fit = self._fit
        if fit is not None and fit.state.preemption is not None:
            write_report(fit.state.preemption, fit.state, self.exit_code)

    def connect_peers(self, send: Callable[[int, float], None] | None) -> None:
        """Distributed: ``send(signum, seconds_left)`` gives every other rank a notice given
        here (``PeerNotices.send``); the watchdog calls it as it starts (this ``fit()``)."""
        fit = self._fit
        if fit is not None:
            fit.send = send

    @contextmanager
    def installed(
        self,
        state: State,
        engine: Engine | None = None,
        patience: float = 0.0,
        *,
        distributed: bool = False,
    ) -> Iterator[None]:
        """Handle :attr:`signals` during the block (only in the main thread); notices given
        during the block (any source) act at once (module docstring).

        With ``engine``, a notice also starts the watchdog that bounds the stop by its
        deadline (``patience``: seconds to wait for the checkpoint before the stuck
        handlers are abandoned; the Trainer passes its ``close_timeout``).
        """
        self._watchdog = None
        fit = FitRun(state, engine, patience, distributed, agreeing=distributed)
        self._fit = fit
        pending = state.preemption
        if pending is not None:  # given before this fit(): it stops at the first boundary
            self._act(fit, pending)
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():

            def handler(signum: int, frame: FrameType | None) -> None:
                watchdog = self._watchdog
                if watchdog is not None and watchdog.raise_now:  # the watchdog's own signal
                    watchdog.raise_now = False
                    raise HandlerAbandoned(
                        f"abandoned: it blocked the event loop after {watchdog.notice.reason}"
                    )
                name = signal.Signals(signum).name
                self.give(state, self.notice(name, source="signal", signum=signum))

            previous = {s: signal.signal(s, handler) for s in self.signals}
            fit.signals = tuple(previous)
        try:
            yield
        finally:
            watchdog = self._watchdog
            if watchdog is not None:
                watchdog.finish()  # first: it sends no signal after this
            notice = state.preemption
            left = 0.0 if notice is None else max(0.0, notice.time_left() - EXIT_MARGIN)
            if notice is not None and fit.saving.acquire(timeout=left):
                fit.saving.release()  # a checkpoint the watchdog was writing is done
            if notice is not None:
                _say(stop_summary(notice, state))
                write_report(notice, state, self.exit_code)
            for s, old in previous.items():
                signal.signal(s, old)
            self._watchdog = None
            self._fit = None

    def raise_if_triggered(self, state: State) -> None:
        """Raise :class:`TrainingPreempted` if a notice stopped the run.

        After a notice from a signal (here or on another rank) the process is on its way
        out with :attr:`exit_code`: from here on ``SIGTERM`` and :attr:`signals` end it at
        once with that status (main thread). ``torchrun`` sends ``SIGTERM`` to every
        worker still running once one has exited, and a rank that stopped for the same
        preemption would otherwise die of it (status -15) while it unwinds or Python tears
        torch down, instead of exiting with :attr:`exit_code`.
        """
        notice = state.preemption
        if notice is not None:
            if notice.source != "call":
                _exit_on({signal.SIGTERM, *self.signals}, self.exit_code)
            raise _preempted(self.exit_code, notice.reason)


def _exit_on(signals: set[int], code: int) -> None:
    """Make ``signals`` end the process at once with ``code`` (main thread only), and
    ignore them from its exit on: Python's finalization puts the default action back in
    place of a Python handler (and runs none), so a signal while torch is torn down would
    still end the process with -15; an ignored one leaves it to exit with ``code``."""
    if threading.current_thread() is not threading.main_thread():
        return

    def leave(signum: int, frame: FrameType | None) -> None:
        os._exit(code)  # the process was ending with this status anyway

    for s in signals:
        with contextlib.suppress(ValueError, OSError):
            signal.signal(s, leave)
    atexit.register(_ignore, tuple(signals))


def _ignore(signals: tuple[int, ...]) -> None:
    for s in signals:
        with contextlib.suppress(ValueError, OSError):
            signal.signal(s, signal.SIG_IGN)


def _preempted(code: int, reason: str) -> TrainingPreempted:
    exc = TrainingPreempted(code)
    exc.add_note(f"trainbus: preempted ({reason}); the run stopped after a checkpoint")
    return exc


def _bound_close(callbacks: Iterable[Any], seconds: float) -> None:
    for cb in callbacks:
        timeout = getattr(cb, "close_timeout", None)
        if isinstance(timeout, float) and timeout > seconds:
            cb.close_timeout = seconds


def check_preemption(value: Any, *, auto: bool = False) -> Preemption | None:
    """``Trainer(preemption=...)``: ``None`` (on when ``auto``), ``False``, ``True`` or a
    :class:`Preemption`."""
    if value is None:
        return Preemption() if auto else None
    if value is False:
        return None
    if value is True:
        return Preemption()
    if isinstance(value, Preemption):
        return value
    raise TypeError(
        f"preemption={value!r} must be None (on under torchrun or SLURM with a "
        "CheckpointSaver), True, False or a trainbus.Preemption(...), e.g. "
        "preemption=True to checkpoint and exit on SIGTERM"
    )


def launched_by_a_scheduler(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the process runs under torchrun or in a SLURM job (``preemption=None``)."""
    env = os.environ if environ is None else environ
    return bool(env.get("TORCHELASTIC_RUN_ID") or env.get("SLURM_JOB_ID")) or all(
        env.get(n) for n in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    )


def takes_checkpoints(callbacks: Iterable[Any]) -> bool:
    """Whether a callback takes checkpoints on request (``CheckpointSaver``)."""
    return bool(savers(callbacks))
