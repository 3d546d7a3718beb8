"""EventStream: fan-out of events and metrics to bounded async subscribers."""

from __future__ import annotations

import json
import math
from typing import Any

import anyio
import pytest
import torch

from tests.helpers import make_trainer
from trainbus import Callback, Event, Timestamp
from trainbus.callbacks import (
    EventStream,
    StreamEvent,
    StreamGap,
    StreamMetrics,
    StreamOverflowError,
    Subscription,
)
from trainbus.callbacks.event_stream import DEFAULT_STREAM_EVENTS
from trainbus.core.callback import resolve_callback

pytestmark = pytest.mark.anyio


def expected_names(n_batches: int, epochs: int) -> list[str]:
    """What a default stream publishes for a run with loggers (loss logged per batch)."""
    names = ["init", "fit_start"]
    for _ in range(epochs):
        names.append("epoch_start")
        names += ["metrics", "batch_end"] * n_batches
        names.append("epoch_end")
    names.append("fit_end")
    return names


def name(item: Any) -> str:
    return item.sse_event


async def collect(sub: Subscription, into: list[Any]) -> None:
    async for item in sub:
        into.append(item)


async def test_subscriber_sees_whole_run_in_order_then_end(no_leaked_threads: None) -> None:
    stream = EventStream()
    trainer = make_trainer(3, 2, loggers=[stream])
    sub = stream.subscribe()
    items: list[Any] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(collect, sub, items)
        await trainer.fit()
    # collect() returned on its own: the iterator ended when the run closed.
    assert [name(i) for i in items] == expected_names(3, 2)
    assert [i.seq for i in items] == list(range(len(items)))
    batch_ends = [i for i in items if isinstance(i, StreamEvent) and i.event is Event.BATCH_END]
    assert [int(i.timestamp.batch) for i in batch_ends] == [1, 2, 3, 4, 5, 6]
    losses = [i for i in items if isinstance(i, StreamMetrics)]
    assert [m.step for m in losses] == [1, 2, 3, 4, 5, 6]
    assert all(isinstance(m.metrics["loss/train"], float) for m in losses)
    assert sub.ended
    assert sub.dropped == 0
    stats = stream.statistics()
    assert stats.ended
    assert stats.subscribers == 0
    assert stats.published == len(items)


async def test_slow_subscriber_loses_oldest_and_never_stalls_training_or_others() -> None:
    stream = EventStream(buffer_size=4)
    trainer = make_trainer(20, 1, loggers=[stream])
    never_read = stream.subscribe()  # nobody iterates it while training runs
    reader = stream.subscribe(buffer_size=1000)
    seen: list[Any] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(collect, reader, seen)
        await trainer.fit()
    total = len(expected_names(20, 1))
    assert len(seen) == total  # the other subscriber lost nothing
    assert never_read.dropped == total - 4
    assert stream.statistics().dropped == total - 4
    late = [item async for item in never_read]
    assert late[0] == StreamGap(missed=total - 4)
    # ...then the newest four items, in order, ending with the run's end.
    assert [i.seq for i in late[1:]] == [total - 4, total - 3, total - 2, total - 1]
    assert name(late[-1]) == "fit_end"


async def test_gap_stands_where_items_were_lost() -> None:
    stream = EventStream(buffer_size=2, events="all", metrics=False)
    sub = stream.subscribe()

    def publish(*seqs: int) -> None:
        for i in seqs:
            stream._publish(StreamEvent(Event.BATCH_END, Timestamp(batch=i), 0.0, i))

    publish(0, 1)
    first = await sub.__anext__()
    assert isinstance(first, StreamEvent)
    assert first.seq == 0
    publish(2, 3, 4)  # buffer of 2 held [1, 2]: 1 and 2 are dropped for 3 and 4
    got = [await sub.__anext__() for _ in range(3)]
    assert got[0] == StreamGap(missed=2)
    assert [g.seq for g in got[1:]] == [3, 4]
    assert sub.dropped == 2
    assert sub.pending == 0


async def test_latest_policy_drops_what_a_newer_item_makes_stale_first() -> None:
    """``on_overflow="latest"``: a full buffer loses the oldest item the new one supersedes
    (metrics whose names it logs again, the same event), else the oldest; a live view keeps
    the newest value of every name. ``drop_oldest`` would have lost the first event."""
    stream = EventStream(buffer_size=3, on_overflow="latest", events="all")
    sub = stream.subscribe()

    def metrics(seq: int, **values: float) -> StreamMetrics:
        return StreamMetrics(values, seq, 0.0, seq)

    def event(seq: int, what: Event = Event.BATCH_END) -> StreamEvent:
        return StreamEvent(what, Timestamp(batch=seq), 0.0, seq)

    for item in (event(1), metrics(2, loss=1.0), metrics(3, acc=0.5)):
        stream._publish(item)  # full: [e1, loss, acc]
    stream._publish(metrics(4, loss=0.9))  # the older loss goes, not the older event
    stream._publish(event(5))  # the older batch_end goes
    stream._publish(metrics(6, acc=0.6, loss=0.8))  # acc (seq 3) goes: the oldest it repeats
    stream._publish(event(7, Event.EPOCH_END))  # supersedes nothing: the oldest (seq 4) goes
    got = [await sub.__anext__() for _ in range(4)]
    assert got[0] == StreamGap(missed=4)
    assert [g.seq for g in got[1:]] == [5, 6, 7]
    assert sub.dropped == 4 and sub.pending == 0


async def test_disconnect_policy_cuts_off_slow_subscriber() -> None:
    stream = EventStream(buffer_size=3, on_overflow="disconnect")
    trainer = make_trainer(5, 1, loggers=[stream])
    slow = stream.subscribe()
    fast = stream.subscribe(buffer_size=1000)  # only the never-reading one is cut off
    seen: list[Any] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(collect, fast, seen)
        await trainer.fit()
    assert [name(i) for i in seen] == expected_names(5, 1)
    assert slow.disconnected
    assert slow.ended
    got = [name(await slow.__anext__()) for _ in range(3)]
    assert got == ["init", "fit_start", "epoch_start"]  # what it had buffered, then the error
    with pytest.raises(StreamOverflowError, match="buffer_size"):
        await slow.__anext__()
    stats = stream.statistics()
    assert stats.disconnected == 1
    assert stats.subscribers == 0


async def test_two_subscribers_see_the_same_run() -> None:
    stream = EventStream()
    trainer = make_trainer(4, 2, loggers=[stream], eval_batches=2)
    a: list[Any] = []
    b: list[Any] = []
    sub_a, sub_b = stream.subscribe(), stream.subscribe()
    async with anyio.create_task_group() as tg:
        tg.start_soon(collect, sub_a, a)
        tg.start_soon(collect, sub_b, b)
        await trainer.fit()
    assert [i.to_dict() for i in a] == [i.to_dict() for i in b]
    names = [name(i) for i in a]
    assert names.count("eval_start") == names.count("eval_end") == 2
    assert names[-1] == "fit_end"


async def test_subscribe_after_end_is_ended_at_once() -> None:
    stream = EventStream()
    await make_trainer(2, 1, loggers=[stream]).fit()
    assert stream.ended
    sub = stream.subscribe()
    assert sub.ended
    assert [item async for item in sub] == []


async def test_cancelled_run_ends_subscriptions() -> None:
    stream = EventStream()
    trainer = make_trainer(50, 1, loggers=[stream])
    sub = stream.subscribe()
    seen: list[str] = []

    async with anyio.create_task_group() as tg:
        scope = anyio.CancelScope()

        async def fit() -> None:
            with scope:
                await trainer.fit()

        tg.start_soon(fit)
        async for item in sub:
            seen.append(name(item))
            if name(item) == "batch_end":
                scope.cancel()
    assert scope.cancelled_caught
    assert "batch_end" in seen
    assert "fit_end" not in seen
    assert stream.ended


async def test_second_fit_reopens_the_stream() -> None:
    stream = EventStream()
    late: list[Subscription] = []

    class SubscribeAtBatch2(Callback):
        async def batch_end(self, state: Any, logger: Any) -> None:
            # By batch 2 the barrier of batch 1 has run the stream's FIT_START handler.
            if int(state.timer.batch_in_epoch) == 2 and not late:
                late.append(stream.subscribe())

    trainer = make_trainer(3, 1, [SubscribeAtBatch2()], loggers=[stream])
    await trainer.fit()
    assert stream.ended
    assert late
    assert late[0].ended
    late.clear()
    await trainer.fit(duration="1ep")
    assert len(late) == 1
    names = [name(i) async for i in late[0]]
    assert names[-2:] == ["epoch_end", "fit_end"]


def test_default_events_and_handlers_registered_only_for_them() -> None:
    assert Event.BEFORE_FORWARD not in DEFAULT_STREAM_EVENTS
    assert Event.BATCH_END in DEFAULT_STREAM_EVENTS
    table = resolve_callback(EventStream(events=[Event.EPOCH_END]))
    # INIT and FIT_START are always handled (they reopen the stream); nothing else is.
    assert set(table.handlers) == {Event.EPOCH_END, Event.INIT, Event.FIT_START}
    assert all(h.is_async for h in table.handlers.values())
    assert set(resolve_callback(EventStream(events="all")).handlers) == set(Event)


async def test_events_filter_and_metrics_off() -> None:
    stream = EventStream(events=["epoch_end", Event.FIT_END], metrics=False)
    trainer = make_trainer(3, 2, loggers=[stream])
    items: list[Any] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(collect, stream.subscribe(), items)
        await trainer.fit()
    assert [name(i) for i in items] == ["epoch_end", "epoch_end", "fit_end"]


async def test_events_all_includes_microbatch_events() -> None:
    stream = EventStream(events="all", metrics=False)
    trainer = make_trainer(1, 1, loggers=[stream])
    items: list[Any] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(collect, stream.subscribe(), items)
        await trainer.fit()
    names = [name(i) for i in items]
    assert "before_forward" in names
    assert "after_backward" in names
    assert names.index("before_forward") < names.index("after_backward")


async def test_unsubscribe_with_async_with() -> None:
    stream = EventStream()
    async with stream.subscribe() as sub:
        assert stream.statistics().subscribers == 1
    assert stream.statistics().subscribers == 0
    assert sub.ended
    stream._publish(StreamEvent(Event.FIT_END, Timestamp(), 0.0))
    assert sub.pending == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"buffer_size": 0}, "buffer_size=0"),
        ({"buffer_size": True}, "buffer_size=True"),
        ({"on_overflow": "block"}, "on_overflow='block'.*drop_oldest"),
        ({"events": ["batch_ended"]}, "batch_ended.*events='all'"),
    ],
)
def test_bad_arguments_name_the_fix(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EventStream(**kwargs)


def test_items_repr_and_json() -> None:
    ev = StreamEvent(Event.EPOCH_END, Timestamp(epoch=1, batch=3), 12.5, 7)
    assert repr(ev) == "StreamEvent(epoch_end, epoch=1, batch=3)"
    assert json.loads(ev.to_json())["event"] == "epoch_end"
    assert ev.to_sse().startswith("id: 7\nevent: epoch_end\ndata: {")
    assert ev.to_sse().endswith("}\n\n")
    m = StreamMetrics({"loss/train": 0.25}, step=3, wall_time=1.0)
    assert repr(m) == "StreamMetrics(step=3, loss/train=0.25)"
    assert StreamGap(2).to_sse() == 'event: gap\ndata: {"type":"gap","missed":2}\n\n'


async def test_logged_values_become_json_ready() -> None:
    stream = EventStream(events=(), metrics=True)
    sub = stream.subscribe()
    from trainbus import LogRecord

    record = LogRecord(
        metrics={"nan": math.nan, "vec": torch.tensor([1.0, 2.0]), "n": 3, "s": "x"},
        step=4,
        wall_time=1.0,
    )
    await stream.log_record(record)
    hp = LogRecord(metrics={"lr": 0.1}, step=0, wall_time=1.0, hyperparameters=True)
    await stream.log_record(hp)
    item = await sub.__anext__()
    assert isinstance(item, StreamMetrics)
    assert json.loads(item.to_json())["metrics"] == {
        "nan": "NaN",
        "vec": [1.0, 2.0],
        "n": 3,
        "s": "x",
    }
    hp_item = await sub.__anext__()
    assert hp_item.sse_event == "hyperparameters"
    assert repr(hp_item) == "StreamHyperparameters(step=0, lr=0.1)"
    with pytest.raises(TypeError):
        item.metrics["n"] = 4  # type: ignore[index]


async def test_history_replays_to_late_subscribers() -> None:
    stream = EventStream(history=5, metrics=False)
    for i in range(8):
        stream._publish(StreamEvent(Event.BATCH_END, Timestamp(batch=i), 0.0, i))

    async def drain(sub: Subscription) -> list[Any]:
        return [await sub.__anext__() for _ in range(sub.pending + (1 if sub._missed else 0))]

    everything = await drain(stream.subscribe(since=0))
    assert everything[0] == StreamGap(missed=3)  # items 0-2 are no longer kept
    assert [i.seq for i in everything[1:]] == [3, 4, 5, 6, 7]
    assert [i.seq for i in await drain(stream.subscribe(since=6))] == [6, 7]
    small = stream.subscribe(since=0, buffer_size=2)
    assert small.dropped == 6
    assert [getattr(i, "seq", "gap") for i in await drain(small)] == ["gap", 6, 7]
    live = stream.subscribe()
    assert live.pending == 0
    with pytest.raises(ValueError, match="since=-1"):
        stream.subscribe(since=-1)


async def test_reopened_stream_forgets_previous_history() -> None:
    stream = EventStream(history=100)
    trainer = make_trainer(2, 1, loggers=[stream])
    await trainer.fit()
    first_run = stream.statistics().published
    late: list[Subscription] = []

    class SubscribeAtEpochEnd(Callback):
        async def epoch_end(self, state: Any, logger: Any) -> None:
            late.append(stream.subscribe(since=0))

    trainer2 = make_trainer(2, 1, [SubscribeAtEpochEnd()], loggers=[stream])
    await trainer2.fit()
    assert late[0].dropped == 0  # the first run's items are not counted as missed
    replayed = [item async for item in late[0]]
    assert name(replayed[0]) == "init"
    assert replayed[0].seq == first_run  # nothing from the first run
