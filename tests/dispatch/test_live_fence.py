"""The live fence (issue 54): a handler's read of live training objects never races training.

Before the training thread zeroes the gradients of batch *n+1* (right after
``BEFORE_TRAIN_BATCH``), every handler of batch *n*'s events (and of every earlier event)
has finished, but a declared ``@trailing(k)`` one's, whatever ``max_lag`` or ``barriers``
say. The tests hold a handler of batch *n* as late as the fence allows (until the training
thread has published batch *n+1*'s ``AFTER_DATALOADER``: in lockstep that would deadlock)
and record, inside the optimizer's ``zero_grad`` itself, which batches it had finished.

``@trailing`` on the handler of an event whose point is live tensors is refused when the
trainer is built, with the callback, the handler and the fix in the message.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from tests.dispatch._probes import Progress, batch_of, fit, until
from tests.helpers import TinyModel, make_loader
from trainbus import Callback, Event, Trainer, blocking, trailing
from trainbus.callbacks import EventStream
from trainbus.core.trailing import LIVE_TENSOR_EVENTS

pytestmark = pytest.mark.anyio

N = 5


class RecordingSGD(torch.optim.SGD):
    """SGD whose ``zero_grad`` (on the training thread) records what ``finished`` holds."""

    def __init__(self, params: Any, finished: list[int]) -> None:
        super().__init__(params, lr=0.1)
        self.finished = finished
        self.at_zero_grad: list[list[int]] = []

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.at_zero_grad.append(sorted(self.finished))
        super().zero_grad(set_to_none=set_to_none)


def trainer_with(callbacks: list[Any], finished: list[int], **kw: Any) -> Trainer:
    model = TinyModel()
    return Trainer(
        model=model,
        train_dataloader=make_loader(N),
        optimizers=RecordingSGD(model.parameters(), finished),
        max_duration="1ep",
        callbacks=callbacks,
        **kw,
    )


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize(
    "options",
    [{"max_lag": 2}, {"barriers": ()}],  # max_lag=1: test_d04_barriers.py
    ids=["max_lag=2", "barriers=()"],
)
async def test_a_late_handler_finishes_before_the_next_batch_zeroes_the_gradients(
    kind: str, options: dict[str, Any]
) -> None:
    progress = Progress()
    finished: list[int] = []
    norms: dict[int, float] = {}
    lock = threading.Lock()

    def norm(state: Any) -> float:
        return float(sum(p.grad.norm() ** 2 for p in state.model.parameters()) ** 0.5)

    if kind == "sync":

        class Late(Callback):
            def after_train_batch(self, state: Any, logger: Any) -> None:
                m = batch_of(state) + 1  # the timer counts the batch at BATCH_END
                progress.wait(lambda p: p.started >= m + 1 or p.fit_ended)
                with lock:
                    norms[m] = norm(state)  # the live gradients: this batch's, still
                    finished.append(m)

    else:

        class Late(Callback):  # type: ignore[no-redef]
            async def after_train_batch(self, state: Any, logger: Any) -> None:
                m = batch_of(state) + 1
                await until(lambda: progress.started >= m + 1 or progress.fit_ended)
                norms[m] = norm(state)
                finished.append(m)

    class Truth(Callback):
        def __init__(self) -> None:
            self.norms: dict[int, float] = {}

        @blocking
        def after_train_batch(self, state: Any, logger: Any) -> None:
            self.norms[batch_of(state) + 1] = norm(state)

    truth = Truth()
    trainer = trainer_with([progress, truth, Late()], finished, **options)
    await fit(trainer)
    opt = trainer.state.optimizers[0]
    assert isinstance(opt, RecordingSGD)
    # Batch m+1's gradients are zeroed only once batch m's handler finished ...
    assert opt.at_zero_grad == [list(range(1, m)) for m in range(1, N + 1)]
    # ... though it ran past batch m's BATCH_END barrier (it waited for batch m+1's load),
    # and what it read was batch m's gradients, as an inline read gives.
    assert norms == pytest.approx(truth.norms, rel=0, abs=0)


async def test_a_declared_trailing_handler_still_crosses_the_fence() -> None:
    progress = Progress()
    finished: list[int] = []
    seen_at_end: dict[int, int] = {}

    class Upload(Callback):
        @trailing(2)
        async def batch_end(self, state: Any, logger: Any) -> None:
            m = batch_of(state)
            # Held until batch m+2 ended: across batch m+1's whole compute.
            await until(lambda: progress.batches >= min(m + 2, N) or progress.fit_ended)
            seen_at_end[m] = progress.batches
            finished.append(m)

    trainer = trainer_with([progress, Upload()], finished)
    await fit(trainer)
    assert seen_at_end == {m: min(m + 2, N) for m in range(1, N + 1)}


@pytest.mark.parametrize("event", sorted(LIVE_TENSOR_EVENTS, key=lambda e: e.value))
def test_trailing_on_a_live_tensor_event_is_refused_with_the_fix(event: Event) -> None:
    def handler(self: Any, state: Any, logger: Any) -> None:
        pass

    handler.__name__ = handler.__qualname__ = event.value
    cls = type("GradNorms", (Callback,), {event.value: trailing(2)(handler)})
    cls.__qualname__ = "GradNorms"
    handler.__qualname__ = f"GradNorms.{event.value}"
    with pytest.raises(ValueError) as info:
        trainer_with([cls()], [])
    message = str(info.value)
    assert f"callbacks[0] (GradNorms): GradNorms.{event.value} handles Event.{event.name}" in (
        message
    )
    assert "@trailing(2)" in message
    assert "Fix: drop the trailing declaration" in message
    assert "@blocking" in message


def test_a_class_wide_trailing_declaration_is_refused_on_a_live_tensor_handler() -> None:
    class GradNorms(Callback):
        trailing = 2

        def after_train_batch(self, state: Any, logger: Any) -> None:
            pass

    with pytest.raises(ValueError, match=r"trailing = 2 \(on the class\).*Fix: drop"):
        trainer_with([GradNorms()], [])


def test_trailing_0_and_trailing_elsewhere_are_accepted() -> None:
    class InStep(Callback):
        @trailing(0)
        def after_train_batch(self, state: Any, logger: Any) -> None:
            pass

        @trailing(2)
        def batch_end(self, state: Any, logger: Any) -> None:
            pass

    trainer_with([InStep(), EventStream(events=[Event.AFTER_FORWARD, Event.BATCH_END])], [])
