"""D3 overlap: publishing a non-barrier event does not wait for its handlers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.dispatch._probes import WATCHDOG, batch_of, fit, until
from tests.helpers import TinyModel, make_trainer
from trainbus import Callback, LoggerDestination, blocking, trailing

pytestmark = pytest.mark.anyio


class LossSignalModel(TinyModel):
    """Sets ``loss_computed`` when the training thread has computed a loss."""

    def __init__(self) -> None:
        super().__init__()
        self.loss_computed = threading.Event()

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        out = super().loss(outputs, batch)
        self.loss_computed.set()
        return out


class LossCountModel(TinyModel):
    """Counts the losses the training thread has computed."""

    def __init__(self) -> None:
        super().__init__()
        self.losses = 0

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        out = super().loss(outputs, batch)
        self.losses += 1
        return out


class FastThenWaits(Callback):
    """Cheap at batch 1; then waits a while for each batch's loss."""

    def __init__(self, model: TinyModel, losses: Callable[[], int], patience: float) -> None:
        self.model, self.losses, self.patience = model, losses, patience
        self.stalls = 0  # calls on the training thread: it could not compute meanwhile
        self.waited: list[tuple[int, bool]] = []

    def after_forward(self, state: Any, logger: Any) -> None:
        b = batch_of(state)
        if b == 0:
            return
        if threading.get_ident() in self.model.forward_threads:
            self.stalls += 1
        deadline = time.monotonic() + self.patience
        while self.losses() <= b and time.monotonic() < deadline:
            time.sleep(0.001)
        self.waited.append((b, self.losses() > b))  # the training thread computed the loss


async def test_d3_publishing_never_waits_for_a_plain_handler_whose_calls_were_cheap() -> None:
    model = LossCountModel()
    cbs = [FastThenWaits(model, lambda: model.losses, WATCHDOG / 4) for _ in range(5)]
    trainer = make_trainer(4, callbacks=cbs, model=model)
    await fit(trainer)
    for cb in cbs:
        assert cb.stalls == 0
        assert cb.waited == [(1, True), (2, True), (3, True)]


async def test_d3_cheap_plain_handlers_never_make_publishing_wait() -> None:
    # A plain handler runs on its callback's thread however cheap its calls were (D7): each
    # handler below returns only once the training thread computed the batch's loss, so a
    # publish that ran it on the spot would wait out its patience every batch.
    model = LossCountModel()
    cbs = [FastThenWaits(model, lambda: model.losses, 0.2) for _ in range(3)]
    await fit(make_trainer(5, callbacks=cbs, model=model))
    for cb in cbs:
        assert cb.waited == [(b, True) for b in range(1, 5)]


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_d3_publishing_does_not_wait_for_the_handlers(kind: str) -> None:
    model = LossSignalModel()
    seen: list[bool] = []

    class Overlap(Callback):
        # AFTER_FORWARD's handler returns only once the training thread went on to compute
        # the loss: a publish that waited for its handlers would deadlock here.
        if kind == "sync":

            def after_forward(self, state: Any, logger: Any) -> None:
                seen.append(model.loss_computed.wait(WATCHDOG / 2))

        else:

            async def after_forward(self, state: Any, logger: Any) -> None:
                await until(model.loss_computed.is_set, "the loss")
                seen.append(True)

    await fit(make_trainer(1, callbacks=[Overlap()], model=model))
    assert seen == [True]


# --- when a handler starts (docs/concurrency.md, "When a handler starts") ---


async def _runs_after_its_batch_s_last_inner_event(late: type[Callback], seen: list) -> None:
    """Fit 4 batches beside ``Marks``: each ``late`` handler appends ``(batch, published)``
    to ``seen``; it must have run after its batch's ``AFTER_TRAIN_BATCH`` was published and
    before the next batch started."""
    published: list[int] = []

    class Marks(Callback):
        @blocking  # on the training thread, as the event is published
        def after_train_batch(self, state: Any, logger: Any) -> None:
            published.append(batch_of(state))

        @blocking
        def batch_start(self, state: Any, logger: Any) -> None:
            assert len(seen) == batch_of(state), "the previous batch's handler had not run"

    late.published = published  # type: ignore[attr-defined]
    await fit(make_trainer(4, callbacks=[Marks(), late()]))
    assert seen == [(b, list(range(b + 1))) for b in range(4)]


async def test_a_plain_in_batch_handler_runs_when_its_batch_ends() -> None:
    # Its callback's thread is woken once a batch, at BATCH_END.
    seen: list[tuple[int, list[int]]] = []

    class Plain(Callback):
        def after_forward(self, state: Any, logger: Any) -> None:
            seen.append((batch_of(state), list(self.published)))  # type: ignore[attr-defined]

    await _runs_after_its_batch_s_last_inner_event(Plain, seen)


async def test_an_async_handler_after_the_batch_s_first_wake_up_runs_when_its_batch_ends() -> None:
    # The loop is woken once inside a batch, at the first publish that queues work for it
    # (here BATCH_START's): what AFTER_FORWARD queues later waits for the batch's end.
    seen: list[tuple[int, list[int]]] = []

    class Late(Callback):
        async def batch_start(self, state: Any, logger: Any) -> None: ...

        async def after_forward(self, state: Any, logger: Any) -> None:
            seen.append((batch_of(state), list(self.published)))  # type: ignore[attr-defined]

    await _runs_after_its_batch_s_last_inner_event(Late, seen)


async def _runs_during_batch_0(early: type[Callback], answered: threading.Event) -> None:
    """Fit 2 batches beside ``Inside``, which sets ``early.inside`` at batch 0's
    ``BEFORE_BACKWARD`` and, at its ``AFTER_BACKWARD``, waits for ``answered``: the
    ``early`` handler, woken when its event was published, must set it while the training
    thread is inside batch 0 (a handler woken at the batch's end would not)."""
    inside = threading.Event()
    seen: list[bool] = []

    class Inside(Callback):
        @blocking
        def before_backward(self, state: Any, logger: Any) -> None:
            if batch_of(state) == 0:
                inside.set()

        @blocking
        def after_backward(self, state: Any, logger: Any) -> None:
            if batch_of(state) == 0:
                seen.append(answered.wait(WATCHDOG / 2))

    early.inside = inside  # type: ignore[attr-defined]
    await fit(make_trainer(2, callbacks=[early(), Inside()]))
    assert seen == [True]


async def test_a_plain_handler_outside_a_batch_starts_at_once() -> None:
    # EPOCH_START lies outside a batch: publishing it wakes the callback's thread. The
    # handler runs while the training thread is in batch 0's lead events (a @blocking
    # AFTER_DATALOADER waits there for it); it finishes before batch 0's gradients are
    # zeroed (the live fence, issue 54), so it cannot overlap the batch's compute.
    answered = threading.Event()
    seen: list[bool] = []

    class Early(Callback):
        def epoch_start(self, state: Any, logger: Any) -> None:
            answered.set()

    class Lead(Callback):
        @blocking
        def after_dataloader(self, state: Any, logger: Any) -> None:
            if batch_of(state) == 0:
                seen.append(answered.wait(WATCHDOG / 2))

    await fit(make_trainer(2, callbacks=[Early(), Lead()]))
    assert seen == [True]


async def test_an_async_before_forward_handler_runs_during_its_batch() -> None:
    # BEFORE_FORWARD's publish is the batch's first that queues work for the loop: it wakes it.
    answered = threading.Event()

    class Early(Callback):
        async def before_forward(self, state: Any, logger: Any) -> None:
            if batch_of(state) == 0:
                await until(self.inside.is_set, "the backward")  # type: ignore[attr-defined]
                answered.set()

    await _runs_during_batch_0(Early, answered)


async def test_an_async_after_forward_handler_alone_runs_during_its_batch() -> None:
    # Whatever the event: the first publish inside a batch that queues work for the loop
    # wakes it (a loop of your own may publish no BEFORE_FORWARD).
    answered = threading.Event()

    class Early(Callback):
        async def after_forward(self, state: Any, logger: Any) -> None:
            if batch_of(state) == 0:
                await until(self.inside.is_set, "the backward")  # type: ignore[attr-defined]
                answered.set()

    await _runs_during_batch_0(Early, answered)


async def test_an_async_batch_checkpoint_handler_runs_with_the_next_batch_s_first_wake_up() -> None:
    # The barrier's wait handed the batch's work over; what BATCH_CHECKPOINT queues after it
    # is handed over by the next batch's first publish that queues work for the loop (its
    # lead events', here), and done by that batch's barrier (D4).
    seen: list[tuple[int, list[int]]] = []
    starts: list[int] = []

    class Marks(Callback):
        @blocking  # after the previous batch's barrier, before its lead's hand-over
        def batch_start(self, state: Any, logger: Any) -> None:
            # batch b-1's call was handed over at batch b-1's start and waited for at its
            # barrier; batch b's own is not handed over yet
            assert [n for n, _ in seen] == list(range(1, batch_of(state)))
            starts.append(batch_of(state))

    class Checkpoints(Callback):
        async def batch_end(self, state: Any, logger: Any) -> None: ...  # the barrier waits

        async def batch_checkpoint(self, state: Any, logger: Any) -> None:
            seen.append((batch_of(state), list(starts)))

    await fit(make_trainer(4, callbacks=[Marks(), Checkpoints()]))
    # the call of the batch that ends with batch count b ran after the next batch's start
    # was published (the last one's at the epoch's end, which wakes the loop)
    assert seen == [(b, list(range(min(b + 1, 4)))) for b in range(1, 5)]


async def test_a_batch_end_call_the_barrier_does_not_wait_for_is_handed_over_at_its_end() -> None:
    # A trailing handler's call: the barrier waits for nothing, so the publish of BATCH_END
    # hands it over. The next batch's start finds it running without any other event.
    started: list[threading.Event] = [threading.Event() for _ in range(4)]
    seen: list[bool] = []

    class Upload(Callback):
        @trailing(2)
        async def batch_end(self, state: Any, logger: Any) -> None:
            started[batch_of(state) - 1].set()

    class Marks(Callback):
        @blocking  # batch b's start: batch b-1's call must have started meanwhile
        def batch_start(self, state: Any, logger: Any) -> None:
            b = batch_of(state)
            if b:
                seen.append(started[b - 1].wait(WATCHDOG / 4))

    trainer = make_trainer(4, callbacks=[Marks(), Upload()])
    await fit(trainer)
    assert seen == [True, True, True]
    assert trainer.engine.statistics().barrier_waits == 0


@pytest.mark.parametrize("batches", [3, 6])
async def test_a_batch_wakes_the_loop_twice_with_the_default_barrier(batches: int) -> None:
    # At its first publish that queues work for the loop (its lead events) and at its
    # BATCH_END barrier: the loop's work a batch is a rule of the events
    # (docs/concurrency.md, "When a handler starts").
    class Everywhere(Callback):
        async def after_dataloader(self, state: Any, logger: Any) -> None: ...
        async def before_forward(self, state: Any, logger: Any) -> None: ...
        async def after_forward(self, state: Any, logger: Any) -> None: ...
        async def after_train_batch(self, state: Any, logger: Any) -> None: ...
        async def batch_end(self, state: Any, logger: Any) -> None: ...
        async def batch_checkpoint(self, state: Any, logger: Any) -> None: ...

    class Sink(LoggerDestination):  # the trainer logs loss/train before each BATCH_END
        def __init__(self) -> None:
            self.steps: list[int | None] = []

        async def log_metrics(self, metrics: Any, step: int | None = None) -> None:
            self.steps.append(step)

    wakeups = []
    for n in (batches, 2 * batches):
        sink = Sink()
        trainer = make_trainer(n, callbacks=[Everywhere(), Everywhere()], loggers=[sink])
        await fit(trainer)
        wakeups.append(trainer.engine.statistics().loop_wakeups)
        assert sink.steps == list(range(1, n + 1))
    # the records ride those two (they were a third wake-up a batch before)
    assert wakeups[1] - wakeups[0] == 2 * batches
