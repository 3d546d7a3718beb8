"""trainbus: a PyTorch training loop whose callbacks run concurrently on an async bus.

The training loop runs on a worker thread and publishes Composer's events; callbacks,
written as plain methods or ``async def`` coroutines, run concurrently on the event loop
(plain ones on threads of their own), so uploads and checkpoints overlap with training.

Example:
    >>> import trainbus
    >>> class Upload(trainbus.Callback):
    ...     async def batch_end(self, state, logger):
    ...         await client.post(url, json={"batch": int(state.timer.batch)})
    >>> trainer = trainbus.Trainer(model, loader, "2ep", loss_fn=F.cross_entropy,
    ...                            callbacks=[Upload()])
    >>> await trainer.fit()
"""

from __future__ import annotations

from trainbus._bus import BusStatistics as BusStatistics
from trainbus._bus import CallbackStatistics as CallbackStatistics
from trainbus._bus import TraceRecorder as TraceRecorder
from trainbus._callback import Callback as Callback
from trainbus._callback import blocking as blocking
from trainbus._distributed import rank_zero_only as rank_zero_only
from trainbus._engine import Engine as Engine
from trainbus._events import Event as Event
from trainbus._exceptions import CallbackSignatureError as CallbackSignatureError
from trainbus._exceptions import CallbackTimeoutWarning as CallbackTimeoutWarning
from trainbus._exceptions import CheckpointLoadError as CheckpointLoadError
from trainbus._exceptions import CheckpointWarning as CheckpointWarning
from trainbus._exceptions import EngineThreadError as EngineThreadError
from trainbus._exceptions import FitInProgressError as FitInProgressError
from trainbus._exceptions import SlowCallbackWarning as SlowCallbackWarning
from trainbus._exceptions import TrainbusError as TrainbusError
from trainbus._exceptions import TrainbusWarning as TrainbusWarning
from trainbus._exceptions import UnknownHandlerWarning as UnknownHandlerWarning
from trainbus._filters import every as every
from trainbus._filters import once as once
from trainbus._logger import Logger as Logger
from trainbus._logger import LoggerDestination as LoggerDestination
from trainbus._logger import LogLevel as LogLevel
from trainbus._logger import LogRecord as LogRecord
from trainbus._preemption import Preemption as Preemption
from trainbus._preemption import TrainingPreempted as TrainingPreempted
from trainbus._serializable import Serializable as Serializable
from trainbus._state import State as State
from trainbus._time import Time as Time
from trainbus._time import TimeUnit as TimeUnit
from trainbus._timer import Timer as Timer
from trainbus._timer import Timestamp as Timestamp
from trainbus._trailing import trailing as trailing
from trainbus._trainer import Trainer as Trainer

__version__ = "0.1.0.dev0"

__all__ = (
    "BusStatistics",
    "Callback",
    "CallbackSignatureError",
    "CallbackStatistics",
    "CallbackTimeoutWarning",
    "CheckpointLoadError",
    "CheckpointWarning",
    "Engine",
    "EngineThreadError",
    "Event",
    "FitInProgressError",
    "LogLevel",
    "LogRecord",
    "Logger",
    "LoggerDestination",
    "Preemption",
    "Serializable",
    "SlowCallbackWarning",
    "State",
    "Time",
    "TimeUnit",
    "Timer",
    "Timestamp",
    "TraceRecorder",
    "Trainer",
    "TrainbusError",
    "TrainbusWarning",
    "TrainingPreempted",
    "UnknownHandlerWarning",
    "blocking",
    "every",
    "once",
    "rank_zero_only",
    "trailing",
)
