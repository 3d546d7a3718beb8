"""ThresholdStopper: training ends right after the first check that reaches the threshold."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.callbacks.test_early_stopper import ScriptedLoss, ScriptedModel
from tests.helpers import make_trainer
from trainbus.callbacks import ThresholdStopper
from trainbus.core.callback import resolve_callback


def fit_batches(stopper: ThresholdStopper, model: Any, n: int = 12, **kw: Any) -> int:
    trainer = make_trainer(n, 1, [stopper], model=model, eval_batches=1, eval_interval="1ba", **kw)
    trainer.fit_sync()
    return int(trainer.state.timer.batch)


def tenths(b: int) -> float:
    return b / 10


@pytest.mark.parametrize(
    ("threshold", "comp", "stops_at"),
    [
        (0.45, None, 5),  # 'score': higher is better by default; 0.5 > 0.45
        (0.5, None, 6),  # strictly greater
        (0.5, "gt", 6),
        (0.25, "lt", 1),  # 0.1 < 0.25 at the first evaluation
        (5.0, None, 12),  # never reached: the run ends normally
        (0.5, lambda value, threshold: value >= threshold, 5),
    ],
)
def test_stops_right_after_the_evaluation_that_reached_the_threshold(
    threshold: float, comp: Any, stops_at: int
) -> None:
    stopper = ThresholdStopper("score", threshold=threshold, comp=comp)
    assert fit_batches(stopper, ScriptedModel(tenths)) == stops_at


def test_exact_without_barriers() -> None:
    stopper = ThresholdStopper("score", threshold=0.45)
    assert fit_batches(stopper, ScriptedModel(tenths), barriers=()) == 5


def test_losses_must_fall_below_by_default() -> None:
    stopper = ThresholdStopper("val_loss", threshold=0.35)
    assert fit_batches(stopper, ScriptedModel(lambda b: 1 - b / 10, "val_loss")) == 7


def test_train_loss_is_checked_at_every_batch_end() -> None:
    stopper = ThresholdStopper("loss", dataloader_label="train", threshold=0.3)
    trainer = make_trainer(20, 1, [stopper], model=ScriptedLoss(lambda b: 1 / b))
    trainer.fit_sync()
    assert int(trainer.state.timer.batch) == 4  # 1/4 < 0.3


def test_epoch_level_evaluation_stops_after_that_epoch() -> None:
    stopper = ThresholdStopper("score", threshold=0.75)
    trainer = make_trainer(4, 10, [stopper], model=ScriptedModel(tenths), eval_batches=1)
    trainer.fit_sync()
    assert int(trainer.state.timer.epoch) == 2  # scores 0.4, 0.8
    assert int(trainer.state.timer.batch) == 8


def test_a_missing_metric_fails_the_fit_naming_the_fix() -> None:
    trainer = make_trainer(2, 1, [ThresholdStopper("f1", threshold=0.5)], eval_batches=1)
    with pytest.raises(ValueError, match=r"ThresholdStopper\(monitor='f1'.*dataloader_label="):
        trainer.fit_sync()


def test_handlers_are_blocking() -> None:
    table = resolve_callback(ThresholdStopper("loss", threshold=0.1))
    assert all(h.is_blocking and not h.is_async for h in table.handlers.values())


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"threshold": math.nan}, ValueError, r"threshold=nan\) can never be reached"),
        ({"threshold": "0.5"}, TypeError, r"threshold='0.5'\) must be a number"),
        ({"threshold": 0.5, "comp": "??"}, ValueError, "is not a known comparison"),
        ({"threshold": 0.5, "dataloader_label": None}, TypeError, "must be 'eval' or 'train'"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        ThresholdStopper("loss", **kwargs)


def test_threshold_is_keyword_only_and_required() -> None:
    with pytest.raises(TypeError):
        ThresholdStopper("loss", "eval", 0.5)  # type: ignore[misc]
    with pytest.raises(TypeError):
        ThresholdStopper("loss")  # type: ignore[call-arg]
