"""EarlyStopper: Composer's patience semantics; training ends at the expected batch."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.helpers import TinyModel, make_trainer
from trainbus import Time, Timestamp
from trainbus.callbacks import EarlyStopper
from trainbus.core.callback import resolve_callback


class ScriptedModel(TinyModel):
    """A model whose eval metric ``score`` is ``script(batches trained so far)``."""

    def __init__(self, script: Callable[[int], float], name: str = "score") -> None:
        super().__init__()
        self.script = script
        self.name = name

    def eval_metrics(self, outputs: Any, batch: Any) -> dict[str, torch.Tensor]:
        return {self.name: torch.tensor(self.script(self.training_forwards))}


class ScriptedLoss(TinyModel):
    """A model whose training loss is ``script(batch number)`` (with a zero gradient term)."""

    def __init__(self, script: Callable[[int], float]) -> None:
        super().__init__()
        self.script = script

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return outputs.sum() * 0 + self.script(self.training_forwards)


def plateau_at_5(b: int) -> float:
    """Improves for batches 1-5, flat afterwards."""
    return float(min(b, 5))


def fit_batches(stopper: EarlyStopper, model: TinyModel, n: int = 12, **kw: Any) -> int:
    kw.setdefault("eval_interval", "1ba")
    trainer = make_trainer(n, 1, [stopper], model=model, eval_batches=1, **kw)
    trainer.fit_sync()
    return int(trainer.state.timer.batch)


@pytest.mark.parametrize(
    ("patience", "stops_at"),
    [
        ("2ba", 8),  # best at 5; 8 - 5 = 3 > 2
        (Time(2, "ba"), 8),
        (2, 8),  # evaluations without improvement: 6, 7, then 8 is the third
        ("0ba", 6),
        (0, 6),
        ("30ba", 12),  # never runs out of patience: the run ends normally
    ],
)
def test_early_stopping_stops_at_the_right_batch(patience: Any, stops_at: int) -> None:
    stopper = EarlyStopper("score", patience=patience)
    assert fit_batches(stopper, ScriptedModel(plateau_at_5)) == stops_at
    assert stopper.best == 5.0
    assert stopper.best_timestamp is not None
    assert int(stopper.best_timestamp.batch) == 5


def test_stops_at_the_same_batch_without_barriers_or_with_lag() -> None:
    for kw in ({"barriers": ()}, {"max_lag": 3}):
        stopper = EarlyStopper("score", patience="2ba")
        assert fit_batches(stopper, ScriptedModel(plateau_at_5), **kw) == 8


def test_epoch_patience_counts_epochs_since_the_best() -> None:
    def per_epoch(b: int) -> float:  # 4 batches an epoch; improves until epoch 2
        return float(min(b // 4, 2))

    stopper = EarlyStopper("score", patience="1ep")
    trainer = make_trainer(4, 10, [stopper], model=ScriptedModel(per_epoch), eval_batches=1)
    trainer.fit_sync()
    # best at the end of epoch 2; epoch 3 is 1 epoch later (not > 1); epoch 4 stops.
    assert int(trainer.state.timer.epoch) == 4
    assert int(trainer.state.timer.batch) == 16


def test_min_delta_ignores_improvements_that_are_too_small() -> None:
    def creeping(b: int) -> float:  # +0.01 a batch after batch 5
        return float(b) if b <= 5 else 5 + 0.01 * (b - 5)

    assert fit_batches(EarlyStopper("score", patience="2ba"), ScriptedModel(creeping)) == 12
    stopper = EarlyStopper("score", patience="2ba", min_delta=0.1)
    assert fit_batches(stopper, ScriptedModel(creeping)) == 8


def test_lower_is_better_for_losses_and_errors_by_default() -> None:
    def falling(b: int) -> float:  # falls until batch 4, then rises
        return float(abs(b - 4))

    for name in ("loss", "val_error", "Perplexity"):
        stopper = EarlyStopper(name, patience="1ba")
        assert fit_batches(stopper, ScriptedModel(falling, name)) == 6, name
    stopper = EarlyStopper("accuracy", patience="1ba")  # higher is better: batch 1 stays best
    assert fit_batches(stopper, ScriptedModel(falling, "accuracy")) == 3


@pytest.mark.parametrize("comp", ["lt", "less", "<", operator.lt, lambda a, b: a < b])
def test_comp_as_string_or_callable(comp: Any) -> None:
    stopper = EarlyStopper("score", patience="2ba", comp=comp)  # lower is better here
    assert fit_batches(stopper, ScriptedModel(plateau_at_5)) == 4  # best at 1; 4 - 1 > 2


def test_train_loss_is_read_from_the_batch_loss() -> None:
    def loss(b: int) -> float:  # falls until batch 3, flat afterwards
        return 1.0 / min(b, 3)

    stopper = EarlyStopper("loss", dataloader_label="train", patience="2ba")
    trainer = make_trainer(20, 1, [stopper], model=ScriptedLoss(loss))
    trainer.fit_sync()
    assert int(trainer.state.timer.batch) == 6
    assert stopper.best == pytest.approx(1 / 3)


def test_a_missing_metric_fails_the_fit_with_the_available_names() -> None:
    trainer = make_trainer(2, 1, [EarlyStopper("accuracy")], eval_batches=1)
    with pytest.raises(ValueError, match=r"found no such metric.*'eval': \['loss'\]") as info:
        trainer.fit_sync()
    assert any("EarlyStopper.eval_end" in note for note in info.value.__notes__)


def test_state_dict_round_trip() -> None:
    stopper = EarlyStopper("score", patience="2ba")
    fit_batches(stopper, ScriptedModel(plateau_at_5))
    restored = EarlyStopper("score", patience="2ba")
    restored.load_state_dict(stopper.state_dict())
    assert restored.best == 5.0
    assert restored.best_timestamp == stopper.best_timestamp
    assert isinstance(restored.best_timestamp, Timestamp)
    assert restored.checks_since_best == stopper.checks_since_best == 3
    empty = EarlyStopper("score")
    empty.load_state_dict(EarlyStopper("score").state_dict())
    assert empty.best is None
    assert empty.best_timestamp is None


def test_handlers_are_blocking_so_the_decision_precedes_the_next_batch() -> None:
    table = resolve_callback(EarlyStopper("loss"))
    assert {e.value for e in table.handlers} == {"eval_end", "batch_end"}
    assert all(h.is_blocking and not h.is_async for h in table.handlers.values())


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"patience": "10sp"}, ValueError, r"patience='10sp'\) must be in epochs or batches"),
        ({"patience": -1}, ValueError, r"patience=-1\) must be >= 0 evaluations"),
        ({"patience": "soon"}, ValueError, r"EarlyStopper\(patience=\.\.\.\)"),
        ({"patience": 1.5}, TypeError, r"EarlyStopper\(patience=\.\.\.\)"),
        ({"comp": "bigger"}, ValueError, r"comp='bigger'\) is not a known comparison; use 'lt'"),
        ({"comp": 3}, TypeError, r"comp=\.\.\.\) must be a callable"),
        ({"dataloader_label": ""}, TypeError, "must be 'eval' or 'train'"),
    ],
)
def test_bad_arguments_name_the_argument_and_the_fix(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        EarlyStopper("loss", **kwargs)
    with pytest.raises(TypeError, match="must be a metric name"):
        EarlyStopper("")
