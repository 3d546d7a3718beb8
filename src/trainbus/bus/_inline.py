"""The inline fast path: cheap plain handlers run without a thread hop. One policy, here.

Waking a lane's thread costs 10-20 us of GIL hand-offs, far more than a handler that
appends to a list. So:

- **Eligibility.** A non-``@blocking`` handler is *cheap* (``slot.inline_ok``) once
  its calls, wherever they ran, took at most ``inline_max`` seconds; a call over
  ``STRIKE_OUT`` times the limit, or two calls in a row over it, ban it from the fast path
  (:func:`learn`): one call just over the limit is forgiven, since on a loaded machine a
  no-op call can be preempted past 50 us, and a ban lasts ``RETRY_AFTER`` calls, doubled
  at each new ban, after which a fast call takes the handler back. An ``async def``
  handler is cheap when its calls also finish without suspending; one that suspends (I/O)
  is banned at once, for good (:func:`ban`). Cheap async handlers are only ever deferred:
  they run on the loop, never on the training thread, so at a barrier their lanes are
  woken, all with one wake-up.
- **Non-barrier events: deferred.** A cheap handler's item is queued on its idle lane
  *without* waking the lane (:meth:`InlinePath.defer`); publishing never waits for it (D3).
- **Barrier events: run here.** At a barrier that waits for the lane (every slot of the
  lane has lag 0), the training thread, which is about to wait anyway, claims each idle lane
  holding deferred items and runs them itself (:meth:`InlinePath.flush`), after waking every
  other lane (D2); the barrier event's own cheap handlers likewise
  (:meth:`InlinePath.run_here`). A barrier that does not wait for a lane (it may trail)
  never runs that lane's handlers on the training thread: it wakes the lane instead.
- **Nobody waits long.** Deferred items go to their lane's thread once a wait needs them, a
  publication finds them older than ``DEFER_MAX``, or the timer thread finds them older than
  that (events may stop coming): a deferred handler runs within about ``DEFER_MAX``
  (10 ms). The bound is wide enough for a typical batch: at 1 ms, a batch that took a little
  longer (a small MLP on a slow machine) sent every cheap lane to its thread every batch.
- **Records: run here in bursts.** A destination's records wait unwoken too (up to
  ``RECORD_DEFER_MAX``, or ``RECORD_BURST`` of them); the producer then runs a cheap plain
  destination's burst itself (``_records.run_records_here``), and the timer thread, later by
  ``_TIMER_SLACK``, wakes the lane only when publishing has paused.

A lane runs its items one at a time, in order (D1), whoever runs them: the training thread
runs a lane's items only while it holds the lane ``CLAIMED`` (``_lane.py``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from trainbus.bus._eligibility import learn
from trainbus.bus._items import EventItem
from trainbus.bus._lane import CLAIMED, IDLE
from trainbus.bus._records import run_records_here
from trainbus.bus._running import skip_event

if TYPE_CHECKING:
    from trainbus.bus._gate import Gate
    from trainbus.bus._lane import Lane
    from trainbus.bus._slot import Slot
    from trainbus.bus._statistics import Counters

__all__ = [
    "DEFER_MAX",
    "RECORD_DEFER_MAX",
    "InlinePath",
]

_perf = time.perf_counter
#: Seconds a deferred item may wait, unwoken, for the next barrier (or other wake-up).
DEFER_MAX = 10e-3
#: Seconds a logged record may wait, unwoken, in its destination's lane. Barriers never
#: wait for records, so a destination is woken once per burst of records instead of once
#: per record (a thread hand-off each): at ``RECORD_BURST`` records, after this long, or
#: when somebody waits for them (``_records.py``). A wake-up hands the GIL to the lane's
#: thread: at 10 ms, MLflowLogger cost +0.13-0.17 ms a 1.2 ms batch, at 100 ms +0.05-0.10
#: (``benchmarks/README.md``); 100 ms is still quick for a console or dashboard.
RECORD_DEFER_MAX = 100e-3
#: How often the timer thread looks at deferred items while there are any.
_TIMER_PERIOD = 2e-3
#: The timer thread wakes overdue records this much later than the producer would: a
#: producer still publishing runs them itself (``run_records``); the timer is for a pause.
_TIMER_SLACK = 20e-3


class InlinePath:
    """The fast path's per-session state: lanes holding deferred items, and the timer."""

    def __init__(
        self,
        gate: Gate,
        counters: Counters,
        inline_max: float,
        wake_loop_lanes: Callable[[list[Lane]], None] | None = None,
    ) -> None:
        self.gate = gate
        self.counters = counters
        self.inline_max = inline_max
        #: Wakes loop lanes with one wake-up of the loop for them all (the dispatcher's
        #: ``wake_lanes``): waking them one by one would hand the GIL to the loop at each.
        self.wake_loop_lanes = wake_loop_lanes
        # Invariant: ``lanes`` and ``since`` change under ``_lock`` only. A lane is listed at
        # most once: its ``deferred`` flag is set before it is listed, cleared once unlisted.
        self.lanes: list[Lane] = []
        self.since = 0.0
        # Likewise for destinations holding records queued unwoken (``records_deferred``).
        self.record_lanes: list[Lane] = []
        self.records_since = 0.0
        self._lock = threading.Lock()
        self._armed = threading.Event()
        self._timer_on = False
        self._closed = False
        self._timer: threading.Thread | None = None

    # -- producer --------------------------------------------------------------------------

    def defer(self, lane: Lane) -> None:
        """List ``lane``, which now holds items queued without a wake-up."""
        lane.deferred = True
        with self._lock:
            if not self.lanes:
                self.since = _perf()
            self.lanes.append(lane)
            self._arm()

    def defer_records(self, lane: Lane) -> bool:
        """List ``lane``, a destination now holding records queued without a wake-up
        (any thread). Returns false, listing nothing, once the session ends (wake it)."""
        with self._lock:
            if self._closed:
                return False
            if not lane.records_deferred:
                lane.records_deferred = True
                if not self.record_lanes:
                    self.records_since = _perf()
                self.record_lanes.append(lane)
                self._arm()
        return True

    def _arm(self) -> None:
        """Make sure the timer thread watches the lists (under ``_lock``)."""
        if not self._timer_on and not self._closed:
            self._timer_on = True
            if self._timer is None:
                self._timer = threading.Thread(
                    target=self._timer_main, name="trainbus-defer-timer", daemon=True
                )
                self._timer.start()
            self._armed.set()

    def overdue(self) -> bool:
        """Whether deferred items have waited longer than ``DEFER_MAX``, or deferred
        records longer than ``RECORD_DEFER_MAX``."""
        now = _perf()
        return (bool(self.lanes) and now - self.since > DEFER_MAX) or (
            bool(self.record_lanes) and now - self.records_since > RECORD_DEFER_MAX
        )

    def flush_overdue(self) -> None:
        """Wake the lanes of whichever list has waited too long (see :meth:`overdue`); a
        cheap destination's records run here instead (producer only, :meth:`run_records`)."""
        rest: list[Lane] = []
        for lane in self._take_overdue(_perf()):
            if self.run_records(lane):
                lane.deferred = lane.records_deferred = False  # unlisted, as in _wake
            else:
                rest.append(lane)
        self._wake(rest)

    def run_records(self, lane: Lane) -> bool:
        """Run an idle cheap destination's leading records here (the producer); return
        whether it did, else the caller wakes the lane (``_records.run_records_here``)."""
        if not run_records_here(lane, self.gate, self.inline_max):
            return False
        if lane.records_deferred:  # a full burst ran: unlist it, so that its clock restarts
            with self._lock:
                if lane.records_deferred and lane in self.record_lanes:
                    lane.records_deferred = False
                    self.record_lanes.remove(lane)
        return True

    def flush_records(self) -> None:
        """Wake every destination holding deferred records (somebody waits for them)."""
        with self._lock:
            lanes, self.record_lanes = self.record_lanes, []
        self._wake(lanes)

    def _take_overdue(self, now: float, slack: float = 0.0) -> list[Lane]:
        with self._lock:
            lanes: list[Lane] = []
            if self.lanes and now - self.since >= DEFER_MAX:
                lanes, self.lanes = self.lanes, []
            if self.record_lanes and now - self.records_since >= RECORD_DEFER_MAX + slack:
                lanes += self.record_lanes
                self.record_lanes = []
            return lanes

    def flush(self, *, run: bool) -> None:
        """Run (at a barrier that waits for them) or wake the lanes holding deferred items.

        The first handler that turns out slow stops the running here; the rest are woken.
        """
        with self._lock:
            lanes, self.lanes = self.lanes, []
        if not lanes:
            return
        here = self._wake(lanes, keep=run)  # loop lanes first: they run while these run here
        cheap = True
        for lane in here:
            if cheap and lane.try_claim(allow_pending=True):
                cheap = self._run_claimed(lane)
            else:
                lane.wake()

    def _wake(self, lanes: list[Lane], *, keep: bool = False) -> list[Lane]:
        """Wake ``lanes`` (unlisted), the loop's with one wake-up; with ``keep``, return the
        thread lanes in step instead of waking them (to run their items here)."""
        kept: list[Lane] = []
        loop_lanes: list[Lane] = []
        for lane in lanes:
            lane.deferred = lane.records_deferred = False
            if not lane.on_thread:
                loop_lanes.append(lane)
            elif keep and lane.uniform:
                kept.append(lane)
            else:
                lane.wake()
        if loop_lanes:
            if self.wake_loop_lanes is not None:
                self.wake_loop_lanes(loop_lanes)
            else:
                for lane in loop_lanes:
                    lane.wake()
        return kept

    def run_here(self, pairs: list[tuple[Lane, Slot]], item: EventItem) -> list[tuple[Lane, Slot]]:
        """Run a barrier event's cheap handlers here, each if its lane is idle and in step;
        return those that did not run (queue them instead).

        The first handler that turns out slow stops the running here: the rest are returned.
        Claiming, running and accounting are written out (they mirror ``Lane.try_claim``,
        :meth:`_run_claimed` and ``Lane.release``) in one loop: this runs once per barrier
        for its cheap handlers, and ``engine.run_event()`` from plain code is nothing else.
        A lane that only the producer queues on is claimed without its lock (``_lane.py``).
        Not counted in ``enq``/``done``: each call ends before anything could wait for it.
        One clock read per call, as in :meth:`_run_claimed`.
        """
        gate = self.gate
        inline_max = self.inline_max
        trace = self.counters.trace
        view, logger, batch = item.view, item.logger, item.batch
        rest: list[tuple[Lane, Slot]] = []
        t0 = _perf()
        for i, (lane, slot) in enumerate(pairs):
            if lane.state != IDLE or lane.enq != lane.done or not lane.uniform:
                rest.append((lane, slot))
                continue
            if lane.producer_only:
                lane.state = CLAIMED
            elif not lane.try_claim():  # records may be waiting in it: they go first
                rest.append((lane, slot))
                continue
            try:
                if gate.stopping:  # a handler failed on a lane: nothing more runs (D10)
                    rest.extend(pairs[i:])
                    break
                lane.current = slot.qualname  # for messages (Ctrl-C, stuck reports)
                try:
                    slot.fn(view, logger)
                except BaseException as exc:
                    gate.fail(exc, slot.handler, slot.event, lane)
                t1 = _perf()
                elapsed = t1 - t0
                t0 = t1
                lane.current = None
                slot.inline_calls += 1
                if elapsed > inline_max or slot.inline_strike:
                    learn(slot, elapsed, inline_max)
                slot.calls += 1
                slot.total_time += elapsed
                if elapsed > slot.max_time:
                    slot.max_time = elapsed
                lane.last_batch = batch
                if trace is not None:
                    trace.handler(lane.name, slot.event, t1 - elapsed, elapsed)
            finally:
                lane.state = IDLE
                if lane.pending:
                    lane.wake()
            if not slot.inline_ok:
                rest.extend(pairs[i + 1:])
                break
        return rest

    def _run_claimed(self, lane: Lane) -> bool:
        """Run a claimed lane's leading cheap event items here; release it after.

        The per-item work of :func:`call_plain`, :func:`learn` (only for a slow call or a
        struck handler) and :func:`finish_event` is written out, with one clock read per
        call (each call's time runs from the previous call's end): this loop runs once per
        deferred handler call, the bulk of a batch's calls at every barrier. A handler's
        time therefore includes this loop's own step (well under a microsecond).
        """
        pending = lane.pending
        slots = lane.slots
        gate = self.gate
        inline_max = self.inline_max
        trace = self.counters.trace
        cheap = True
        try:
            t0 = _perf()
            while pending:
                item = pending[0]
                if item.__class__ is not EventItem:
                    break
                slot = slots[item.event]
                if not slot.inline_ok:
                    break
                pending.popleft()
                if gate.stopping:
                    skip_event(lane)
                    continue
                lane.current = slot.qualname  # for messages (Ctrl-C, stuck reports)
                try:
                    slot.fn(item.view, item.logger)
                except BaseException as exc:
                    gate.fail(exc, slot.handler, slot.event, lane)
                t1 = _perf()
                elapsed = t1 - t0
                t0 = t1
                lane.current = None
                slot.inline_calls += 1
                if elapsed > inline_max or slot.inline_strike:
                    learn(slot, elapsed, inline_max)
                slot.calls += 1
                slot.total_time += elapsed
                if elapsed > slot.max_time:
                    slot.max_time = elapsed
                lane.last_batch = item.batch
                if trace is not None:
                    trace.handler(lane.name, slot.event, t1 - elapsed, elapsed)
                lane.done += 1
                target = lane.wait_done
                if target is not None and lane.done >= target:
                    lane.notify(lane)
                if not slot.inline_ok:
                    cheap = False
                    break
        finally:
            lane.release()
        return cheap

    # -- the timer thread ------------------------------------------------------------------

    def _timer_main(self) -> None:
        while True:
            self._armed.wait()
            if self._closed:
                return
            with self._lock:  # sleep until the first list is due, at least a period
                due = min(
                    self.since + DEFER_MAX if self.lanes else math.inf,
                    self.records_since + RECORD_DEFER_MAX + _TIMER_SLACK
                    if self.record_lanes else math.inf,
                )
            time.sleep(_TIMER_PERIOD if due == math.inf else max(due - _perf(), _TIMER_PERIOD))
            lanes = self._take_overdue(_perf(), _TIMER_SLACK)
            with self._lock:
                if self._closed:
                    return
                if not self.lanes and not self.record_lanes:
                    self._timer_on = False
                    self._armed.clear()
            self._wake(lanes)

    def close(self) -> None:
        """Wake every deferred lane and end the timer thread (session end)."""
        with self._lock:
            self._closed = True
            lanes, self.lanes = self.lanes + self.record_lanes, []
            self.record_lanes = []
        self._armed.set()
        self._wake(lanes)
        if self._timer is not None:
            self._timer.join()
