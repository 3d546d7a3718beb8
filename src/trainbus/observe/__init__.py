"""What a run lets you watch: the bus's statistics, the timeline of handler calls, the batch
clock.

Values and recorders only, with no threads and no dispatch of their own: the bus fills them
(``bus/counters.py`` reads its counts into a :class:`BusStatistics`, its workers and producer
write spans into a :class:`TraceRecorder`, the producer ticks the :class:`BatchClock` at each
``BATCH_END``); the dashboard, Prometheus' metrics and the fit's time account read them.
``trainbus`` and ``trainbus.bus`` export the public ones.
"""

from trainbus.observe.clock import STEP_BUCKETS, BatchClock
from trainbus.observe.statistics import BusStatistics, CallbackStatistics
from trainbus.observe.trace import PRODUCER_ROW, TraceRecorder, TraceSpan

__all__ = [
    "PRODUCER_ROW",
    "STEP_BUCKETS",
    "BatchClock",
    "BusStatistics",
    "CallbackStatistics",
    "TraceRecorder",
    "TraceSpan",
]
