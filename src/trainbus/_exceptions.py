"""Exceptions and warnings raised by trainbus.

Hierarchy::

    TrainbusError (Exception)
    ├── EngineThreadError (TrainbusError, RuntimeError)   wrong thread: would deadlock
    ├── FitInProgressError (TrainbusError, RuntimeError)  fit() while a fit is running
    ├── CallbackSignatureError (TrainbusError, TypeError) a handler cannot be called
    └── StreamOverflowError                               an EventStream subscriber fell behind
    TrainbusWarning (UserWarning)
    ├── SlowCallbackWarning                               handlers slower than the batch
    ├── MetricsUploadWarning                              points refused or not delivered
    ├── CallbackTimeoutWarning                            a callback missed close_timeout
    └── UnknownHandlerWarning                             a handler-like method no event calls

Errors raised by callbacks are never wrapped: ``fit()`` raises the callback's own
exception, with a note naming the callback and the event.
"""

from __future__ import annotations

__all__ = [
    "CallbackSignatureError",
    "CallbackTimeoutWarning",
    "EngineThreadError",
    "FitInProgressError",
    "MetricsUploadWarning",
    "SlowCallbackWarning",
    "StreamOverflowError",
    "TrainbusError",
    "TrainbusWarning",
    "UnknownHandlerWarning",
]


class TrainbusError(Exception):
    """Base class of the errors trainbus itself raises."""


class EngineThreadError(TrainbusError, RuntimeError):
    """A blocking engine call was made from a thread where it would deadlock."""


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


class MetricsUploadWarning(TrainbusWarning):
    """Points were refused by the server, or not delivered before ``close_timeout``."""


class CallbackTimeoutWarning(TrainbusWarning):
    """A callback missed its ``close_timeout`` and was abandoned, or keeps training waiting."""


class UnknownHandlerWarning(TrainbusWarning):
    """A callback method looks like a handler (``on_batch_end``) but no event calls it."""

# -- checkpoints (trainbus.callbacks.CheckpointSaver, Trainer(load_path=...)) -----------------

__all__ += ["CheckpointLoadError", "CheckpointWarning"]


class CheckpointLoadError(TrainbusError, RuntimeError):
    """A checkpoint is missing, truncated, corrupt, or does not match the model; names the path."""


class CheckpointWarning(TrainbusWarning):
    """A callback's state is in the checkpoint but not in the run, or the other way round."""
