"""The event bus: the training thread publishes, lanes run handlers, barriers join them.

Only this package knows there are threads and event loops. One event's path, in order of
the modules it passes: ``producer`` (publish, on the training thread) -> ``lanes`` (the
callback's queue) -> ``bridge`` (waking the loop) -> ``runners`` (the handler runs) ->
``lanes`` (counted done; the gate the training thread waits at). ``members`` says where
each handler runs, ``pool`` which lane thread runs a plain callback, ``records`` queues
logged records on the destinations (``mailbox`` for those with a lossy ``backpressure``),
``session`` runs one cycle and closes it, ``engine`` is the entry point.
``docs/concurrency.md`` describes the model (guarantees D1-D14).
"""

from __future__ import annotations

from trainbus.bus.bridge import LoopHandle, LoopThread, no_running_loop
from trainbus.bus.lanes import Stopped
from trainbus.bus.options import (
    DEFAULT_CLOSE_TIMEOUT,
    DEFAULT_LANE_THREADS,
    DEFAULT_WAIT_WARNING,
    BusOptions,
)
from trainbus.bus.pool import LaneThreadError
from trainbus.bus.statistics import BusStatistics, CallbackStatistics
from trainbus.bus.trace import PRODUCER_ROW, TraceRecorder, TraceSpan

__all__ = [
    "DEFAULT_CLOSE_TIMEOUT",
    "DEFAULT_LANE_THREADS",
    "DEFAULT_WAIT_WARNING",
    "PRODUCER_ROW",
    "BusOptions",
    "BusStatistics",
    "CallbackStatistics",
    "LaneThreadError",
    "LoopHandle",
    "LoopThread",
    "Stopped",
    "TraceRecorder",
    "TraceSpan",
    "no_running_loop",
]
