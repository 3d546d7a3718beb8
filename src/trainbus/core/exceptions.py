"""Exceptions and warnings raised by trainbus.

Every exception and warning trainbus defines for users to see lives here, re-exported
where users import it from. Hierarchy::

    TrainbusError (Exception)
    ├── EngineThreadError (TrainbusError, RuntimeError)   wrong thread: would deadlock
    ├── ThreadStartError (TrainbusError, RuntimeError)    the system refused a thread trainbus needs
    │   └── LaneThreadError                               ... a lane thread or the training thread
    ├── FitInProgressError (TrainbusError, RuntimeError)  fit() while a fit is running
    ├── CallbackSignatureError (TrainbusError, TypeError) a handler cannot be called
    ├── CheckpointLoadError (TrainbusError, RuntimeError) a checkpoint cannot be resumed from
    ├── CheckpointSaveError (TrainbusError, TypeError)    a callback state it could not load
    ├── StreamOverflowError                               an EventStream subscriber fell behind
    ├── TrackingServerError (TrainbusError, RuntimeError) a tracking server refused a request
    ├── HandlerInterrupted                                an async handler held the loop too long
    ├── HandlerAbandoned                                  a handler preemption's watchdog gave up on
    ├── ServiceClosedError (TrainbusError, RuntimeError)  serve: a job while the manager is down
    ├── TooManyJobsError (TrainbusError, RuntimeError)    serve: max_running jobs are running
    └── JobFactoryError (TrainbusError, TypeError)        serve: the job factory broke its contract
    Stopped (Exception)                                   the bus stopped: training unwinds
    SystemExit
    └── TrainingPreempted                                 fit_sync() after a preemption's checkpoint
    TrainbusWarning (UserWarning)
    ├── SlowCallbackWarning                               handlers slower than the batch
    ├── MetricsUploadWarning                              points refused or not delivered
    ├── CallbackTimeoutWarning                            a callback missed close_timeout
    ├── UnknownHandlerWarning                             a handler-like method no event calls
    ├── RecordsDroppedWarning                             a lossy destination dropped records
    ├── CheckpointWarning                                 a callback's state in one side only
    ├── SlowRankWarning                                   a rank holds the others back
    └── FitNotAwaitedWarning (TrainbusWarning, RuntimeWarning)  trainer.fit() never awaited

Each class shows as the public module users import it from (``trainbus.X``, or
``trainbus.loggers.X`` / ``trainbus.callbacks.X`` / ``trainbus.bus.X`` /
``trainbus.serve.X``), in tracebacks and ``repr``. ``Stopped`` is the bus's own: it is
raised on the training thread and caught by the session, never by a user. Exceptions a
single module raises and catches itself (a retryable HTTP reply, a damaged archive) stay
private beside their use.

Errors raised by callbacks are never wrapped: ``fit()`` raises the callback's own
exception, with a note naming the callback and the event.
"""

from __future__ import annotations

__all__ = [
    "CallbackSignatureError",
    "CallbackTimeoutWarning",
    "EngineThreadError",
    "FitInProgressError",
    "FitNotAwaitedWarning",
    "MetricsUploadWarning",
    "RecordsDroppedWarning",
    "SlowCallbackWarning",
    "SlowRankWarning",
    "StreamOverflowError",
    "ThreadStartError",
    "TrackingServerError",
    "TrainbusError",
    "TrainbusWarning",
    "UnknownHandlerWarning",
]


class TrainbusError(Exception):
    """Base class of the errors trainbus itself raises."""


class EngineThreadError(TrainbusError, RuntimeError):
    """A blocking engine call was made from a thread where it would deadlock."""


class ThreadStartError(TrainbusError, RuntimeError):
    """The operating system refused to start a thread trainbus needs (``ulimit -u``, a
    container's pids limit): the message names the thread and the limits read here.

    Raised where the user called (``Trainer(...)``, ``fit()``), with nothing of the call
    left running. ``trainbus.bus.LaneThreadError`` (a lane thread) is a subclass.

    Attributes:
        thread_name: The name of the thread that could not be started.
    """

    def __init__(self, message: str, thread_name: str = "") -> None:
        super().__init__(message)
        self.thread_name = thread_name


class FitInProgressError(TrainbusError, RuntimeError):
    """``fit()`` was called while the same trainer is already fitting."""


class CallbackSignatureError(TrainbusError, TypeError):
    """A callback's handler does not accept the arguments trainbus passes it."""


class TrainbusWarning(UserWarning):
    """Base class of the warnings trainbus emits."""


class SlowCallbackWarning(TrainbusWarning):
    """A callback's handlers take longer than the batch they observe."""


class StreamOverflowError(TrainbusError):
    """A subscriber fell ``buffer_size`` items behind under ``on_overflow="disconnect"``."""


class TrackingServerError(TrainbusError, RuntimeError):
    """A tracking server (MLflow) refused a request that retrying cannot fix."""


class MetricsUploadWarning(TrainbusWarning):
    """Points were refused by the server, or not delivered before ``close_timeout``."""


class CallbackTimeoutWarning(TrainbusWarning):
    """A callback missed its ``close_timeout`` and was abandoned, or keeps training waiting."""


class UnknownHandlerWarning(TrainbusWarning):
    """A callback method looks like a handler (``on_batch_end``) but no event calls it."""


class RecordsDroppedWarning(TrainbusWarning):
    """A destination's lossy ``backpressure`` dropped or merged records during a fit."""


class FitNotAwaitedWarning(TrainbusWarning, RuntimeWarning):
    """``trainer.fit()`` was called but never awaited, so nothing was trained."""


# -- checkpoints (trainbus.callbacks.CheckpointSaver, Trainer(load_path=...)) -----------------

__all__ += ["CheckpointLoadError", "CheckpointSaveError", "CheckpointWarning"]


class CheckpointLoadError(TrainbusError, RuntimeError):
    """A checkpoint is missing, truncated, corrupt, or does not match the model; names the path."""


class CheckpointSaveError(TrainbusError, TypeError):
    """A callback's ``state_dict()`` holds a value the checkpoint could not load back."""


class SlowRankWarning(TrainbusWarning):
    """One rank holds the others back (rank zero warns once per rank)."""


class CheckpointWarning(TrainbusWarning):
    """A callback's state is in the checkpoint but not in the run, or the other way round."""


# Tracebacks and ``repr`` show where users import a class from, not this private module:
# ``trainbus.FitInProgressError``, not ``trainbus.core.exceptions.FitInProgressError``. Each is
# importable from the module named here, so pickling (e.g. across processes) still works.
for _cls in (
    TrainbusError,
    EngineThreadError,
    ThreadStartError,
    FitInProgressError,
    CallbackSignatureError,
    TrainbusWarning,
    SlowCallbackWarning,
    CallbackTimeoutWarning,
    UnknownHandlerWarning,
    RecordsDroppedWarning,
    FitNotAwaitedWarning,
    CheckpointLoadError,
    CheckpointSaveError,
    CheckpointWarning,
):
    _cls.__module__ = "trainbus"
StreamOverflowError.__module__ = "trainbus.callbacks"
MetricsUploadWarning.__module__ = "trainbus.loggers"
TrackingServerError.__module__ = "trainbus.loggers"
del _cls

#: The note a thread-bound resource's error gets (see :func:`add_thread_bound_hint`).
THREAD_BOUND_HINT = (
    "trainbus: a callback's plain handlers run on the callback's own thread, not on the "
    "thread that built it, so a resource bound to its creating thread (this sqlite3 "
    "connection, opened in __init__?) fails there; open it in the callback's init or "
    "fit_start handler instead: docs/porting-from-composer.md, \"Thread-bound resources\""
)


def add_thread_bound_hint(exc: BaseException) -> None:
    """Add :data:`THREAD_BOUND_HINT` to ``exc`` if it is sqlite3's wrong-thread error.

    ``sqlite3.ProgrammingError: SQLite objects created in a thread can only be used in that
    same thread`` is what a Composer callback meets that opened its connection in
    ``__init__``; it is recognised by its type's module and its message, once.
    """
    if (
        type(exc).__module__ == "sqlite3"
        and "same thread" in str(exc)
        and THREAD_BOUND_HINT not in getattr(exc, "__notes__", ())
    ):
        exc.add_note(THREAD_BOUND_HINT)


class HandlerInterrupted(TrainbusError):
    """Raised inside an ``async def`` handler that held the event loop's thread past its
    deadline without awaiting, under ``fit_sync()`` (``docs/concurrency.md``,
    "Deadlines"); ``fit()`` raises it with a note naming the handler and its event."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args or (
            "this async def handler held the event loop's thread past its deadline without "
            "awaiting, and trainbus interrupted it",
        ))


HandlerInterrupted.__module__ = "trainbus"
__all__ += ["HandlerInterrupted"]


# -- the bus, preemption and the service (moved here from bus/, runtime/, serve/) --------------

__all__ += [
    "HandlerAbandoned",
    "JobFactoryError",
    "LaneThreadError",
    "ServiceClosedError",
    "Stopped",
    "TooManyJobsError",
    "TrainingPreempted",
]


class LaneThreadError(ThreadStartError):
    """The operating system refused to start a lane thread (or the training thread) of a fit
    (a :class:`~trainbus.ThreadStartError`)."""


class Stopped(Exception):
    """Raised on the training thread when the bus stops (an error, a cancellation)."""


class HandlerAbandoned(TrainbusError):
    """Raised inside a handler that blocked the event loop past preemption's patience."""


class TrainingPreempted(SystemExit):
    """Raised by ``fit_sync()`` after a preemption notice stopped and checkpointed the run.

    A ``SystemExit``: uncaught, the process exits with :attr:`code` and no traceback.
    """


class ServiceClosedError(TrainbusError, RuntimeError):
    """A job was started while the manager is not running (before start or at shutdown)."""


class JobFactoryError(TrainbusError, TypeError):
    """The job factory broke its contract (not a Trainer, or the job's loggers missing)."""


class TooManyJobsError(TrainbusError, RuntimeError):
    """A job was started while ``max_running`` jobs are running."""


LaneThreadError.__module__ = "trainbus.bus"
HandlerAbandoned.__module__ = "trainbus.runtime.preemption"
SlowRankWarning.__module__ = "trainbus.runtime.rank_times"
TrainingPreempted.__module__ = "trainbus"
for _cls in (ServiceClosedError, JobFactoryError, TooManyJobsError):
    _cls.__module__ = "trainbus.serve"
del _cls
