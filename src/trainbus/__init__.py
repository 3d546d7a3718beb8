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

import typing as _typing

if _typing.TYPE_CHECKING:
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
    from trainbus.core.exceptions import ThreadStartError as ThreadStartError
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

_HOMES: dict[str, str] = {  # each public name and the module that defines it
    "BusStatistics": "trainbus.bus",
    "CallbackStatistics": "trainbus.bus",
    "TraceRecorder": "trainbus.bus",
    "Engine": "trainbus.bus.engine",
    "Backpressure": "trainbus.core.backpressure",
    "Callback": "trainbus.core.callback",
    "blocking": "trainbus.core.callback",
    "LoggerDestination": "trainbus.core.destination",
    "Event": "trainbus.core.events",
    "CallbackSignatureError": "trainbus.core.exceptions",
    "CallbackTimeoutWarning": "trainbus.core.exceptions",
    "CheckpointLoadError": "trainbus.core.exceptions",
    "CheckpointSaveError": "trainbus.core.exceptions",
    "CheckpointWarning": "trainbus.core.exceptions",
    "EngineThreadError": "trainbus.core.exceptions",
    "FitInProgressError": "trainbus.core.exceptions",
    "FitNotAwaitedWarning": "trainbus.core.exceptions",
    "HandlerInterrupted": "trainbus.core.exceptions",
    "RecordsDroppedWarning": "trainbus.core.exceptions",
    "SlowCallbackWarning": "trainbus.core.exceptions",
    "ThreadStartError": "trainbus.core.exceptions",
    "TrainbusError": "trainbus.core.exceptions",
    "TrainbusWarning": "trainbus.core.exceptions",
    "UnknownHandlerWarning": "trainbus.core.exceptions",
    "every": "trainbus.core.filters",
    "once": "trainbus.core.filters",
    "Logger": "trainbus.core.logger",
    "LogLevel": "trainbus.core.logger",
    "LogRecord": "trainbus.core.logger",
    "PreemptionNotice": "trainbus.core.notice",
    "Serializable": "trainbus.core.serializable",
    "State": "trainbus.core.state",
    "Time": "trainbus.core.time",
    "TimeUnit": "trainbus.core.time",
    "Timer": "trainbus.core.timer",
    "Timestamp": "trainbus.core.timer",
    "trailing": "trainbus.core.trailing",
    "Bus": "trainbus.integrations.loop",
    "rank_zero_only": "trainbus.runtime.distributed",
    "Preemption": "trainbus.runtime.preemption",
    "TrainingPreempted": "trainbus.runtime.preemption",
    "TimeAccount": "trainbus.training.account",
    "CallbackTime": "trainbus.training.account",
    "Trainer": "trainbus.training.trainer",
}

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
    "ThreadStartError",
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


def __getattr__(name: str) -> _typing.Any:
    """Import a public name's module on first use: ``import trainbus`` (and the command
    line's ``--help``) stays cheap, and torch is imported when the Trainer is asked for."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'trainbus' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
