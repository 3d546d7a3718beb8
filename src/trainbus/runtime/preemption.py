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
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainbus.core.state import State

__all__ = ["Preemption", "TrainingPreempted", "check_preemption"]


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

    def trigger(self, state: State, signum: int) -> None:
        """Ask the savers for a checkpoint, bound the loggers' close, stop training."""
        from trainbus.callbacks.checkpoint_saver import CheckpointSaver

        if self.signum is not None:
            return  # already stopping
        self.signum = signum
        for cb in state.callbacks:
            if isinstance(cb, CheckpointSaver):
                cb.request_save()
        _bound_close(state.callbacks, self.grace)
        state.stop_training()

    @contextmanager
    def installed(self, state: State) -> Iterator[None]:
        """Handle :attr:`signals` during the block (only in the main thread)."""
        self.signum = None
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, frame: FrameType | None) -> None:
            self.trigger(state, signum)

        previous = {s: signal.signal(s, handler) for s in self.signals}
        try:
            yield
        finally:
            for s, old in previous.items():
                signal.signal(s, old)

    def raise_if_triggered(self) -> None:
        """Raise :class:`TrainingPreempted` if a signal stopped the run."""
        if self.signum is not None:
            raise _preempted(self.exit_code, signal.Signals(self.signum).name)


def _preempted(code: int, name: str) -> TrainingPreempted:
    exc = TrainingPreempted(code)
    exc.add_note(f"trainbus: {name} received; the run stopped after a checkpoint")
    return exc


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
