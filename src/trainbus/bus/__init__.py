"""The event bus: the training thread publishes, lanes run handlers, barriers join them.

Only this package knows there are two threads. See ``_bus.py`` for the map of its modules
and ``docs/concurrency.md`` for the model it implements.
"""

from __future__ import annotations

from trainbus.bus._bridge import LoopHandle, LoopThread, no_running_loop
from trainbus.bus._bus import EventBus
from trainbus.bus._options import (
    DEFAULT_CLOSE_TIMEOUT,
    DEFAULT_INLINE_MAX,
    DEFAULT_WAIT_WARNING,
    BusOptions,
)
from trainbus.bus._statistics import BusStatistics, CallbackStatistics
from trainbus.bus._stopped import Stopped
from trainbus.bus._trace import PRODUCER_ROW, TraceRecorder, TraceSpan

__all__ = [
    "DEFAULT_CLOSE_TIMEOUT",
    "DEFAULT_INLINE_MAX",
    "DEFAULT_WAIT_WARNING",
    "PRODUCER_ROW",
    "BusOptions",
    "BusStatistics",
    "CallbackStatistics",
    "EventBus",
    "LoopHandle",
    "LoopThread",
    "Stopped",
    "TraceRecorder",
    "TraceSpan",
    "no_running_loop",
]
