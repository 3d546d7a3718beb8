"""The event bus: the training thread publishes, workers run handlers, barriers join them.

One event's path, in order of the modules it passes: ``producer`` (publish, on the training
thread) -> ``queue`` (each worker's queue) -> ``worker`` (woken by the producer's wake rule,
a lane thread or a task on the loop runs the handlers) -> ``queue`` (counted done; the gate
the training thread waits at).
``members`` says where each handler runs, ``records`` queues logged records on the
destinations (``mailbox`` for those with a lossy ``backpressure``), ``session`` runs one
cycle and closes it, ``engine`` is the entry point. What it counts and records for the user
(statistics, the timeline, the batch clock) are ``trainbus.observe``'s values.
``docs/concurrency.md`` describes the model (guarantees D1-D14).
"""

from __future__ import annotations

import importlib
from typing import Any

from trainbus.core.exceptions import LaneThreadError
from trainbus.observe.statistics import BusStatistics, CallbackStatistics
from trainbus.observe.trace import PRODUCER_ROW, TraceRecorder, TraceSpan

#: What users use: the statistics and the trace (``trainbus.observe``'s), and the error a fit
#: raises when the system refuses a thread; the rest is plumbing.
__all__ = [
    "PRODUCER_ROW",
    "BusStatistics",
    "CallbackStatistics",
    "LaneThreadError",
    "TraceRecorder",
    "TraceSpan",
]

#: Plumbing this package once exported, still importable from here: its home module now.
_PLUMBING = {
    "DEFAULT_CLOSE_TIMEOUT": "trainbus.bus.options",
    "DEFAULT_LANE_THREADS": "trainbus.bus.options",
    "DEFAULT_WAIT_WARNING": "trainbus.bus.options",
    "BusOptions": "trainbus.bus.options",
    "LoopHandle": "trainbus.core.bridge",
    "LoopThread": "trainbus.core.bridge",
    "no_running_loop": "trainbus.core.bridge",
    "Stopped": "trainbus.core.exceptions",
}


def __getattr__(name: str) -> Any:
    home = _PLUMBING.get(name)
    if home is None:
        raise AttributeError(f"module 'trainbus.bus' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
