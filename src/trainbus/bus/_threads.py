"""Thread lanes: a callback with plain handlers gets a long-lived thread of its own.

A plain handler that blocks then blocks neither the loop (D7) nor other callbacks (D2).
The thread sleeps on its lane's tokens while the lane is not ``ACTIVE`` and is woken once
per burst; it runs the callback's coroutine handlers too, on the loop, waiting for each
(the :class:`~trainbus.bus._bridge.Spawner`), so the callback's handlers stay in order.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from trainbus.bus._eligibility import learn
from trainbus.bus._items import CallItem, EventItem, LogItem, StopItem
from trainbus.bus._running import finish_event, skip_event

if TYPE_CHECKING:
    from trainbus.bus._bridge import LoopHandle, Spawner
    from trainbus.bus._gate import Gate
    from trainbus.bus._lane import Lane
    from trainbus.bus._statistics import Counters
    from trainbus.core.logger import LogRecord

__all__ = ["ThreadDriver"]

_perf = time.perf_counter


class ThreadDriver:
    """Runs one thread lane's items on the lane's thread (see the module docstring)."""

    def __init__(
        self,
        lane: Lane,
        gate: Gate,
        counters: Counters,
        loop: LoopHandle,
        spawner: Spawner,
        inline_max: float,
    ) -> None:
        self.lane = lane
        self.gate = gate
        self.counters = counters
        self.loop = loop
        self.spawner = spawner
        self.inline_max = inline_max

    def run(self) -> None:
        """The thread's body: run items until the lane's ``STOP`` item."""
        lane = self.lane
        tokens = lane.tokens
        while True:
            item = lane.take()
            if item is None:
                tokens.get()
                continue
            if isinstance(item, StopItem):
                return
            self._run_item(item)
            lane.current = None

    def _run_item(self, item: EventItem | LogItem | CallItem) -> None:
        lane = self.lane
        if isinstance(item, EventItem):
            slot = lane.slots[item.event]
            if self.gate.stopping:
                skip_event(lane)
                return
            lane.current = slot.handler.qualname
            t0 = _perf()
            try:
                if slot.is_async:
                    self.spawner.run(lane, slot.fn, item.view, item.logger, cancellable=True)
                else:
                    slot.fn(item.view, item.logger)
            except BaseException as exc:
                self.gate.fail(exc, slot.handler, slot.event, lane)
            elapsed = _perf() - t0
            learn(slot, elapsed, self.inline_max)
            finish_event(lane, slot, item, elapsed, self.counters)
        elif isinstance(item, LogItem):
            if not lane.failed:  # a failed destination gets no more records (D10)
                self._deliver(item.record)
            lane.count_log_done()
        else:
            error: BaseException | None = None
            lane.current = item.label or None
            try:
                if item.is_async:
                    self.spawner.run(lane, item.fn, cancellable=True)
                else:
                    item.fn()
            except BaseException as exc:
                error = exc
            self.loop.call_soon_if_running(item.on_done, error)

    def _deliver(self, record: LogRecord) -> None:
        slot = self.lane.log_slot
        assert slot is not None, "only destinations receive records"
        t0 = _perf()
        try:
            record.resolve()
            if slot.is_async:
                self.spawner.run(self.lane, slot.fn, record)
            else:
                slot.fn(record)
        except BaseException as exc:
            self.gate.fail(exc, slot.handler, None, self.lane)
        elapsed = _perf() - t0
        slot.account(elapsed)
        if not slot.is_async:  # a cheap one may then run on the producer (``_inline.py``)
            learn(slot, elapsed, self.inline_max)

    def drain_broken(self, error: BaseException) -> None:
        """After an internal error: account items without running them, until ``STOP``.

        Nobody may wait forever on a lane that can no longer run handlers: events and
        counted records are counted as done, calls fail with ``error``.
        """
        lane = self.lane
        while True:
            item = lane.take()
            if item is None:
                lane.tokens.get()
            elif isinstance(item, EventItem):
                skip_event(lane)
            elif isinstance(item, LogItem):
                lane.count_log_done()
            elif isinstance(item, CallItem):
                self.loop.call_soon_if_running(item.on_done, error)
            else:
                return
