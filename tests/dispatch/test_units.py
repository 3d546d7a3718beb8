"""Unit tests of the bus's parts: a lane's run state, the gate, the drivers' edge paths.

The guarantee tests (``test_d*.py``) drive whole runs; these pin the protocols those runs
rest on, one transition at a time, so that a broken invariant fails here with a name
instead of as a rare hang there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Coroutine, Generator
from typing import Any

import anyio
import pytest
import torch

from trainbus import Callback, Engine, Event, Logger, State
from trainbus.bus._coroutine import Resume as _Resume
from trainbus.bus._eligibility import RETRY_AFTER, RETRY_MAX, STRIKE_OUT, ban, learn
from trainbus.bus._gate import Gate
from trainbus.bus._items import STOP, CallItem, EventItem, LogItem
from trainbus.bus._lane import ACTIVE, CLAIMED, IDLE, Lane
from trainbus.bus._slot import Member
from trainbus.bus._statistics import Counters
from trainbus.bus._stopped import Stopped
from trainbus.bus._threads import ThreadDriver
from trainbus.core.callback import resolve_callback
from trainbus.core.logger import LogRecord


class Plain(Callback):
    def batch_end(self, state: Any, logger: Any) -> None:
        return None


def make_lane(wakes: list[Lane] | None = None, notes: list[Lane] | None = None) -> Lane:
    member = Member(resolve_callback(Plain()), 0, None, 0)
    lane = Lane(member)
    lane.wake_driver = (wakes if wakes is not None else []).append
    lane.notify = (notes if notes is not None else []).append
    return lane


def event_item() -> EventItem:
    state = State(model=torch.nn.Linear(1, 1), max_duration="1ep")
    view = state.snapshot()
    return EventItem(Event.BATCH_END, view, Logger(state), 0)


# -- the run state ---------------------------------------------------------------------------


def test_wake_moves_an_idle_lane_to_active_and_wakes_its_driver_once() -> None:
    wakes: list[Lane] = []
    lane = make_lane(wakes)
    lane.pending.append(STOP)
    lane.wake()
    lane.wake()  # already ACTIVE: no second wake-up
    assert lane.state == ACTIVE
    assert wakes == [lane]


def test_take_returns_items_in_order_then_goes_idle() -> None:
    lane = make_lane()
    first, second = event_item(), event_item()
    lane.pending.extend([first, second])
    assert lane.activate()
    assert lane.take() is first
    assert lane.take() is second
    assert lane.take() is None
    assert lane.state == IDLE


def test_a_driver_going_idle_keeps_running_for_an_item_that_just_arrived() -> None:
    lane = make_lane()
    lane.activate()
    lane.pending.append(event_item())  # appended by a producer that read ACTIVE: no wake
    assert lane.go_idle() is True  # the driver's look under the lock finds it
    assert lane.state == ACTIVE


def test_after_going_idle_the_next_append_wakes_the_driver() -> None:
    wakes: list[Lane] = []
    lane = make_lane(wakes)
    lane.activate()
    assert lane.go_idle() is False and lane.state == IDLE
    lane.pending.append(event_item())
    lane.wake()
    assert wakes == [lane] and lane.state == ACTIVE


def test_try_claim_takes_only_an_idle_lane_and_release_wakes_for_late_items() -> None:
    wakes: list[Lane] = []
    lane = make_lane(wakes)
    assert lane.try_claim()
    assert lane.state == CLAIMED
    assert not lane.try_claim()  # nobody else may claim or drive it now
    lane.pending.append(event_item())
    lane.wake()  # a waker sees CLAIMED: the claimer will see the item on release
    assert wakes == []
    lane.release()
    assert lane.state == ACTIVE
    assert wakes == [lane]


def test_try_claim_refuses_queued_items_unless_asked_to_run_them() -> None:
    lane = make_lane()
    lane.pending.append(event_item())  # a deferred item: queued on an idle lane
    assert not lane.try_claim()
    assert lane.try_claim(allow_pending=True)


def test_claim_or_ask_on_a_running_lane_is_handed_over_when_it_goes_idle() -> None:
    notes: list[Lane] = []
    lane = make_lane(notes=notes)
    lane.pending.append(event_item())
    lane.activate()
    assert not lane.claim_or_ask()  # its driver runs it: ask for it
    lane.take()
    assert lane.take() is None  # the driver goes idle ...
    assert lane.state == CLAIMED  # ... and hands the lane over instead
    assert notes == [lane]


def test_claim_or_ask_on_an_idle_lane_with_deferred_items_lets_its_driver_run_them() -> None:
    wakes: list[Lane] = []
    lane = make_lane(wakes)
    lane.pending.append(event_item())
    assert not lane.claim_or_ask()
    assert lane.state == ACTIVE and lane.want_claim
    assert wakes == [lane]


def test_withdraw_claim_gives_back_a_lane_handed_over_too_late() -> None:
    lane = make_lane()
    lane.activate()
    assert not lane.claim_or_ask()
    assert lane.take() is None  # handed over as CLAIMED, but the claimer is unwinding
    lane.withdraw_claim()
    assert lane.state == IDLE and not lane.want_claim


def test_one_runner_at_a_time_under_racing_producers_and_claimers() -> None:
    """Producers append and wake, a claimer claims and releases, a driver drains: every
    item runs exactly once and never two at once (D1)."""
    inside = threading.Lock()
    ran: list[int] = []
    wake = threading.Semaphore(0)
    lane = make_lane()
    lane.wake_driver = lambda _: wake.release()
    items = 4000
    done = threading.Event()

    def run_one(value: int) -> None:
        assert inside.acquire(blocking=False), "two runners at once"
        ran.append(value)
        inside.release()

    def driver() -> None:
        while not done.is_set():
            item = lane.take()
            if item is None:
                wake.acquire(timeout=0.01)
                continue
            run_one(item)  # type: ignore[arg-type]

    def producer(offset: int) -> None:
        for i in range(items // 2):
            lane.pending.append(offset + i)  # type: ignore[arg-type]
            lane.wake()

    def claimer() -> None:
        while not done.is_set():
            if lane.try_claim(allow_pending=True):
                while lane.pending:
                    try:
                        value = lane.pending.popleft()
                    except IndexError:
                        break
                    run_one(value)  # type: ignore[arg-type]
                lane.release()

    threads = [threading.Thread(target=f) for f in (driver, claimer)]
    threads += [threading.Thread(target=producer, args=(k * items,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads[2:]:
        t.join()
    for _ in range(1000):
        if len(ran) == items:
            break
        lane.wake()
        threading.Event().wait(0.005)
    done.set()
    for t in threads[:2]:
        t.join()
    assert sorted(ran) == sorted([*range(items // 2), *range(items, items + items // 2)])


# -- the gate ------------------------------------------------------------------------------


def test_gate_wait_returns_at_once_when_every_target_is_reached() -> None:
    gate = Gate(Counters())
    lane = make_lane()
    lane.notify = gate.reached
    gate.wait([(lane, 0)], "barrier")  # nothing to wait for
    assert lane.wait_done is None


def test_gate_wait_wakes_when_the_lane_counts_its_target() -> None:
    counters = Counters()
    gate = Gate(counters)
    lane = make_lane()
    lane.notify = gate.reached
    lane.enq = 2
    finisher = threading.Timer(0.01, lambda: (lane.count_done(), lane.count_done()))
    finisher.start()
    gate.wait([(lane, 2)], "barrier")
    finisher.join()
    assert lane.done == 2 and counters.barrier_waits == 1


def test_gate_stop_unblocks_a_waiting_producer_with_stopped() -> None:
    gate = Gate(Counters())
    lane = make_lane()
    lane.notify = gate.reached
    lane.enq = 1
    threading.Timer(0.01, gate.stop).start()
    with pytest.raises(Stopped):
        gate.wait([(lane, 1)], "barrier")


def test_gate_fail_notes_the_handler_and_marks_its_lane_failed() -> None:
    gate = Gate(Counters())
    lane = make_lane()
    handler = lane.member.table.handlers[Event.BATCH_END]
    error = ValueError("boom")
    gate.fail(error, handler, Event.BATCH_END, lane)
    assert gate.stopping and lane.failed and gate.errors == [error]
    assert error.__notes__ == ["raised by Plain.batch_end while handling Event.BATCH_END"]


# -- the thread driver after an internal error ---------------------------------------------


def test_drain_broken_counts_events_and_records_fails_calls_and_stops() -> None:
    gate = Gate(Counters())
    lane = make_lane()
    lane.notify = gate.reached
    calls: list[BaseException | None] = []

    class Loop:
        def call_soon_if_running(self, fn: Any, *args: Any) -> None:
            fn(*args)

    driver = ThreadDriver(lane, gate, Counters(), Loop(), None, 0.0)  # type: ignore[arg-type]
    record = LogRecord({"x": 1.0}, 0, 0.0)
    lane.pending.extend(
        [event_item(), LogItem(record), CallItem(lambda: None, False, calls.append), STOP]
    )
    lane.enq = 1
    lane.log_enq = 1
    lane.activate()
    error = RuntimeError("internal")
    driver.drain_broken(error)
    assert (lane.done, lane.log_done) == (1, 1)
    assert calls == [error]


# -- resuming a started coroutine (the dispatcher's hand-over) -----------------------------


class _Suspend:
    def __await__(self) -> Generator[str, Any, Any]:
        sent = yield "suspended"
        return sent


async def _handler(log: list[str]) -> str:
    try:
        value = await _Suspend()
        log.append(f"resumed with {value}")
        return "done"
    except KeyError:
        log.append("thrown into")
        raise
    except GeneratorExit:
        log.append("closed")
        raise


def _started(log: list[str]) -> tuple[Coroutine[Any, Any, str], Any]:
    coro = _handler(log)
    return coro, coro.send(None)


def test_resume_sends_to_a_coroutine_started_elsewhere() -> None:
    log: list[str] = []
    coro, yielded = _started(log)
    awaiting = _Resume(coro, yielded).__await__()
    assert next(awaiting) == "suspended"
    with pytest.raises(StopIteration) as stop:
        awaiting.send("x")
    assert stop.value.value == "done" and log == ["resumed with x"]


def test_resume_throws_into_the_started_coroutine() -> None:
    log: list[str] = []
    coro, yielded = _started(log)
    awaiting = _Resume(coro, yielded).__await__()
    next(awaiting)
    with pytest.raises(KeyError):
        awaiting.throw(KeyError("k"))
    assert log == ["thrown into"]


def test_resume_closes_the_started_coroutine_when_it_is_closed() -> None:
    log: list[str] = []
    coro, yielded = _started(log)
    awaiting = _Resume(coro, yielded).__await__()
    next(awaiting)
    awaiting.close()
    assert log == ["closed"]


@pytest.mark.anyio
async def test_resume_inside_a_real_task_keeps_cancel_scopes_working() -> None:
    async def handler() -> str:
        with anyio.move_on_after(0.01) as scope:
            await anyio.sleep(10)
        return "cancelled in time" if scope.cancelled_caught else "not cancelled"

    coro = handler()
    yielded = coro.send(None)  # started outside any task step of its own (eagerly)
    assert await _Resume(coro, yielded) == "cancelled in time"


# -- the inline fast path's verdict (learn) -------------------------------------------------


def _batch_end_slot() -> Any:
    member = Member(resolve_callback(Plain()), 0, None, 0)
    return member.slots[Event.BATCH_END]


LIMIT = 50e-6


def test_learn_makes_a_cheap_handler_inline() -> None:
    slot = _batch_end_slot()
    learn(slot, LIMIT / 2, LIMIT)
    assert slot.inline_ok and not slot.inline_banned


def test_learn_forgives_one_call_just_over_the_limit() -> None:
    slot = _batch_end_slot()
    learn(slot, LIMIT / 2, LIMIT)
    learn(slot, 3 * LIMIT, LIMIT)  # e.g. preempted on a loaded machine
    assert slot.inline_ok and not slot.inline_banned
    learn(slot, LIMIT / 2, LIMIT)  # a cheap call clears the strike
    learn(slot, 3 * LIMIT, LIMIT)
    assert slot.inline_ok and not slot.inline_banned


def test_learn_bans_two_calls_in_a_row_over_the_limit() -> None:
    slot = _batch_end_slot()
    learn(slot, LIMIT / 2, LIMIT)
    learn(slot, 2 * LIMIT, LIMIT)
    learn(slot, 2 * LIMIT, LIMIT)
    assert not slot.inline_ok and slot.inline_banned
    learn(slot, LIMIT / 10, LIMIT)
    assert not slot.inline_ok  # it sits out RETRY_AFTER calls first


def test_learn_bans_one_call_far_over_the_limit_at_once() -> None:
    slot = _batch_end_slot()
    learn(slot, LIMIT / 2, LIMIT)
    learn(slot, (STRIKE_OUT + 1) * LIMIT, LIMIT)
    assert not slot.inline_ok and slot.inline_banned


def _ban_for_slowness(slot: Any) -> None:
    learn(slot, (STRIKE_OUT + 1) * LIMIT, LIMIT)
    assert slot.inline_banned


def test_a_banned_handler_sits_out_its_wait_then_a_fast_call_takes_it_back() -> None:
    slot = _batch_end_slot()
    learn(slot, LIMIT / 2, LIMIT)
    _ban_for_slowness(slot)
    for _ in range(RETRY_AFTER):  # fast calls on its thread: still sitting out
        learn(slot, LIMIT / 10, LIMIT)
        assert not slot.inline_ok
    learn(slot, LIMIT / 10, LIMIT)  # judged afresh: cheap again
    assert slot.inline_ok and not slot.inline_banned


def test_each_new_ban_doubles_the_wait_up_to_the_cap() -> None:
    slot = _batch_end_slot()
    waits = []
    for _ in range(14):
        _ban_for_slowness(slot)
        waits.append(slot.inline_wait)
        while slot.inline_wait:
            learn(slot, LIMIT / 10, LIMIT)
    assert waits[:3] == [RETRY_AFTER, 2 * RETRY_AFTER, 4 * RETRY_AFTER]
    assert waits[-1] == RETRY_MAX


def test_a_slow_handler_judged_again_is_banned_again_without_running_fast() -> None:
    slot = _batch_end_slot()
    _ban_for_slowness(slot)
    for _ in range(RETRY_AFTER):
        learn(slot, (STRIKE_OUT + 1) * LIMIT, LIMIT)
    learn(slot, (STRIKE_OUT + 1) * LIMIT, LIMIT)  # judged: still slow
    assert not slot.inline_ok and slot.inline_banned
    assert slot.inline_wait == 2 * RETRY_AFTER


def test_an_async_handler_that_suspends_is_banned_for_good() -> None:
    slot = _batch_end_slot()
    ban(slot)
    for _ in range(RETRY_MAX + 1):
        learn(slot, LIMIT / 10, LIMIT)
    assert not slot.inline_ok and slot.inline_banned


class SlowAtFirst(Callback):
    """Its first two calls are slow (a preempted thread on a loaded machine, say)."""

    def __init__(self) -> None:
        self.calls = 0

    def batch_end(self, state: Any, logger: Any) -> None:
        self.calls += 1
        if self.calls <= 2:
            time.sleep(20 * LIMIT)  # the slow calls' work


def test_a_handler_banned_for_slow_first_calls_runs_inline_again_once_fast() -> None:
    """It was banned for good before: every later call paid a thread hand-off."""
    handler = SlowAtFirst()
    state = State(model=torch.nn.Linear(1, 1), max_duration="1ep")
    engine = Engine(state, Logger(state), [handler], warn_slow=False, inline_max=LIMIT)
    try:
        for _ in range(3 * RETRY_AFTER):
            engine.run_event(Event.BATCH_END)
    finally:
        engine.close()
    (stats,) = engine.statistics().callbacks
    assert handler.calls == 3 * RETRY_AFTER
    assert stats.inline >= RETRY_AFTER, stats
