"""Interval: which BATCH_END / EPOCH_END timestamps are due, for every unit."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from trainbus import Event, State, Time
from trainbus.callbacks._interval import Interval

E = Event


def run_counts(
    interval: Any, max_duration: str, *, batches: int, per_epoch: int, samples: int = 4,
    tokens: int = 0,
) -> tuple[list[int], list[int]]:  # fmt: skip
    """Drive a real State through ``batches`` batches; return the due batches and epochs."""
    state = State(model=torch.nn.Linear(1, 1), max_duration=Time.from_timestring(max_duration))
    every = Interval(interval)
    due_batches, due_epochs = [], []
    for _ in range(batches):
        state.batch_num_samples = samples
        state.batch_num_tokens = tokens
        state._timer.on_batch_complete(samples, tokens)
        assert not every.is_due(E.AFTER_TRAIN_BATCH, state)
        if every.is_due(E.BATCH_END, state):
            due_batches.append(int(state.timestamp.batch))
        if int(state.timestamp.batch_in_epoch) == per_epoch:
            state._timer.on_epoch_complete()
            if every.is_due(E.EPOCH_END, state):
                due_epochs.append(int(state.timestamp.epoch))
    return due_batches, due_epochs


@pytest.mark.parametrize(
    ("interval", "max_duration", "batches", "epochs"),
    [
        ("1ba", "6ba", [1, 2, 3, 4, 5, 6], []),
        ("2ba", "6ba", [2, 4, 6], []),
        (Time(3, "ba"), "6ba", [3, 6], []),
        ("1ep", "3ep", [], [1, 2, 3]),
        (2, "3ep", [], [2]),  # an int counts epochs
        ("10sp", "6ba", [3, 5], []),  # 4 samples a batch: crosses 10 at 12, 20 at 20
        ("8sp", "6ba", [2, 4, 6], []),
        ("0.5dur", "6ba", [3, 6], []),
        ("0.3dur", "10ba", [3, 6, 9], []),  # exact: 0.3 * 10 is 3, not 3.0000000000000004
        ("0.1dur", "10ba", list(range(1, 11)), []),
        ("0.5dur", "2ep", [], [1, 2, 3]),  # a fraction of epochs is checked at EPOCH_END
        ("0.5dur", "3ep", [], [2, 3]),  # 1.5 epochs: crossed during epochs 2 and 3
    ],
)
def test_due_timestamps_per_unit(
    interval: Any, max_duration: str, batches: list[int], epochs: list[int]
) -> None:
    n = 10 if max_duration == "10ba" else 6
    assert run_counts(interval, max_duration, batches=n, per_epoch=2) == (batches, epochs)


def test_tokens_cross_multiples_and_zero_token_batches_are_never_due() -> None:
    assert run_counts("25tok", "6ba", batches=6, per_epoch=2, tokens=10) == ([3, 5], [])
    assert run_counts("25tok", "6ba", batches=6, per_epoch=2, tokens=0) == ([], [])


def test_decision_needs_no_history_so_a_resumed_run_agrees() -> None:
    """A fresh Interval asked mid-run (as after loading a checkpoint) gives the same answer."""
    state = State(model=torch.nn.Linear(1, 1), max_duration=Time(10, "ba"))
    for _ in range(5):
        state.batch_num_samples = 4
        state._timer.on_batch_complete(4)
    assert Interval("5ba").is_due(E.BATCH_END, state)
    assert Interval("20sp").is_due(E.BATCH_END, state)
    assert not Interval("3ba").is_due(E.BATCH_END, state)


def test_event_for_and_repr() -> None:
    state = State(model=torch.nn.Linear(1, 1), max_duration=Time(3, "ep"))
    assert Interval("2ba").event_for(state) is E.BATCH_END
    assert Interval(1).event_for(state) is E.EPOCH_END
    assert Interval("0.5dur").event_for(state) is E.EPOCH_END
    assert repr(Interval("10ba")) == "Interval('10ba')"


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ("0ba", ValueError, r"interval='0ba' must be positive; use e\.g\. '10ba'"),
        (0, ValueError, "must be positive"),
        ("2dur", ValueError, r"more than the whole run; use a fraction in \(0, 1\]"),
        ("10xx", ValueError, "unknown unit"),
        (1.5, TypeError, "must be a Time, a str or an int"),
        (-1, ValueError, "must not be negative"),
    ],
)
def test_bad_intervals_name_the_argument_and_the_fix(
    value: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        Interval(value)
    with pytest.raises(error, match=r"Thing\(every=\.\.\.\)"):
        Interval(value, name="Thing(every=...)")
