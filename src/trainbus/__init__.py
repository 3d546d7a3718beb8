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

from trainbus.bus import BusStatistics as BusStatistics
from trainbus.bus import CallbackStatistics as CallbackStatistics
from trainbus.bus import TraceRecorder as TraceRecorder
from trainbus.bus.engine import Engine as Engine
from trainbus.core.backpressure import Backpressure as Backpressure
from trainbus.core.callback import Callback as Callback
from trainbus.core.callback import blocking as blocking
from trainbus.core.destination import LoggerDestination as LoggerDestination
from trainbus.core.events import Event as Event
from trainbus.core.exceptions import CallbackSignatureError as CallbackSignatureError
from trainbus.core.exceptions import CallbackTimeoutWarning as CallbackTimeoutWarning
from trainbus.core.exceptions import CheckpointLoadError as CheckpointLoadError
from trainbus.core.exceptions import CheckpointSaveError as CheckpointSaveError
from trainbus.core.exceptions import CheckpointWarning as CheckpointWarning
from trainbus.core.exceptions import EngineThreadError as EngineThreadError
from trainbus.core.exceptions import FitInProgressError as FitInProgressError
from trainbus.core.exceptions import FitNotAwaitedWarning as FitNotAwaitedWarning
from trainbus.core.exceptions import HandlerInterrupted as HandlerInterrupted
from trainbus.core.exceptions import RecordsDroppedWarning as RecordsDroppedWarning
from trainbus.core.exceptions import SlowCallbackWarning as SlowCallbackWarning
from trainbus.core.exceptions import TrainbusError as TrainbusError
from trainbus.core.exceptions import TrainbusWarning as TrainbusWarning
from trainbus.core.exceptions import UnknownHandlerWarning as UnknownHandlerWarning
from trainbus.core.filters import every as every
from trainbus.core.filters import once as once
from trainbus.core.logger import Logger as Logger
from trainbus.core.logger import LogLevel as LogLevel
from trainbus.core.logger import LogRecord as LogRecord
from trainbus.core.notice import PreemptionNotice as PreemptionNotice
from trainbus.core.serializable import Serializable as Serializable
from trainbus.core.state import State as State
from trainbus.core.time import Time as Time
from trainbus.core.time import TimeUnit as TimeUnit
from trainbus.core.timer import Timer as Timer
from trainbus.core.timer import Timestamp as Timestamp
from trainbus.core.trailing import trailing as trailing
from trainbus.integrations.loop import Bus as Bus
from trainbus.runtime.distributed import rank_zero_only as rank_zero_only
from trainbus.runtime.preemption import Preemption as Preemption
from trainbus.runtime.preemption import TrainingPreempted as TrainingPreempted
from trainbus.training.account import CallbackTime as CallbackTime
from trainbus.training.account import TimeAccount as TimeAccount
from trainbus.training.trainer import Trainer as Trainer

__version__ = "0.1.0.dev0"

__all__ = (
    "Backpressure",
    "Bus",
    "BusStatistics",
    "Callback",
    "CallbackSignatureError",
    "CallbackStatistics",
    "CallbackTime",
    "CallbackTimeoutWarning",
    "HandlerInterrupted",
    "CheckpointLoadError",
    "CheckpointSaveError",
    "CheckpointWarning",
    "Engine",
    "EngineThreadError",
    "Event",
    "FitInProgressError",
    "FitNotAwaitedWarning",
    "LogLevel",
    "LogRecord",
    "Logger",
    "LoggerDestination",
    "Preemption",
    "PreemptionNotice",
    "RecordsDroppedWarning",
    "Serializable",
    "SlowCallbackWarning",
    "State",
    "Time",
    "TimeAccount",
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
