"""Slow callbacks and long waits: a statistic, and what a warning about them says.

The slow check compares, at each of the first few ``BATCH_END`` events, each callback's
handler time since the previous check with the batch's own time less its waits; one slower
than most checked batches is marked slow (``Member.slow``) and warned about once
(``docs/concurrency.md``, "Watching it").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainbus.bus.counters import Counters
    from trainbus.bus.members import Member, Slot
    from trainbus.bus.worker import Lane
    from trainbus.core.events import Event

__all__ = ["SlowCallbacks", "long_wait_message"]

#: Batches (after the first) whose handler time is compared with the batch time.
CHECK_BATCHES = 3
#: Handler seconds per batch under which a callback is never slow (scheduling noise).
MIN_BUSY = 5e-3


class SlowCallbacks:
    """The state of the check for one session. Invariant: the training thread alone reads
    and writes it, and ``Member.slow`` and ``Member.slow_batches``."""

    __slots__ = ("busy_marks", "checking", "checks", "last_batch_end", "slow_batches", "wait_mark")

    def __init__(self) -> None:
        self.checks = 0
        self.checking = True  # batches are still checked (a field: read at every BATCH_END)
        self.last_batch_end = 0.0
        self.wait_mark = 0.0
        self.busy_marks: dict[int, float] = {}
        self.slow_batches: dict[int, int] = {}

    def at_batch_end(self, members: Sequence[Member], counters: Counters,
                     warn: Callable[[str, object], None] | None) -> None:
        """Check the batch that just ended: mark the slow callbacks (``Member.slow``) once
        the checks are done, and ``warn`` about each (unless ``warn`` is ``None``)."""
        now = time.perf_counter()
        waited = counters.barrier_wait + counters.backpressure_wait
        batch_time = (now - self.last_batch_end) - (waited - self.wait_mark)
        self.last_batch_end = now
        self.wait_mark = waited
        self.checks += 1
        marks = self.busy_marks
        for member in members:
            busy = sum(slot.total_time for slot in member.all_slots())
            delta = busy - marks.get(member.index, busy)
            marks[member.index] = busy
            if self.checks > 1 and delta > batch_time and delta > MIN_BUSY:
                self.slow_batches[member.index] = self.slow_batches.get(member.index, 0) + 1
        if self.checks > CHECK_BATCHES:
            self.checking = False
            for member in members:
                member.slow_batches = self.slow_batches.get(member.index, 0)
                if member.slow_batches >= CHECK_BATCHES - 1:
                    member.slow = True
                    if warn is not None:
                        slowest = max(member.slots.values(), key=lambda s: s.total_time,
                                      default=None)
                        where = member.table.callback if slowest is None else slowest.handler.fn
                        warn(_message(member, slowest), where)


def _message(member: Member, slowest: Slot | None) -> str:
    where = slowest.handler.qualname if slowest is not None else member.name
    event = f"Event.{slowest.event.name}" if slowest and slowest.event else "its events"
    advice = (
        "move the work off the per-batch events, declare handlers that only read their "
        "event's snapshot @trainbus.trailing(k), or let every handler trail with "
        "Trainer(max_lag=...)"
    )
    if slowest is not None and not slowest.is_async:
        advice = "make its blocking I/O async, " + advice
    return (
        f"callback {member.name} spends longer in its handlers than a batch takes "
        f"(slowest: {where} on {event}); training waits for it at every barrier: {advice}"
    )


_WAITING_FOR = {
    "barrier": "at the barrier",
    "fence": "at the live fence (before the gradients are zeroed)",
    "backpressure": "for room in a callback's queue (queue_size)",
    "records": "for room among logged records (queue_size)",
    "blocking": "to run a @blocking handler",
}


def long_wait_message(kind: str, event: Event | None, lanes: list[Lane], seconds: float) -> str:
    """What the training thread has waited ``seconds`` for: the callbacks and handlers."""
    at = _WAITING_FOR.get(kind, "")
    if event is not None:
        at += f" of Event.{event.name}" if kind == "barrier" else f" at Event.{event.name}"
    names = ", ".join(f"{lane.name} (running {lane.current})" if lane.current else lane.name
                      for lane in lanes)
    return (
        f"the training thread has waited {seconds:g} s {at} for "
        f"{names or 'its callbacks'}; it keeps waiting (Trainer(wait_warning_seconds=...) sets "
        "when this warns)"
    )
