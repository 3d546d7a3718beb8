"""Event: Composer v0.6's members and values (plus FIT_END), and its pair properties."""

from __future__ import annotations

import inspect

import pytest

import trainbus
from trainbus import Event

# SPEC section 2, in order, then FIT_END.
SPEC_MEMBERS = [
    "INIT",
    "FIT_START",
    "EPOCH_START",
    "BATCH_START",
    "AFTER_DATALOADER",
    "BEFORE_TRAIN_BATCH",
    "BEFORE_FORWARD",
    "AFTER_FORWARD",
    "BEFORE_LOSS",
    "AFTER_LOSS",
    "BEFORE_BACKWARD",
    "AFTER_BACKWARD",
    "AFTER_TRAIN_BATCH",
    "BATCH_END",
    "BATCH_CHECKPOINT",
    "EPOCH_END",
    "EPOCH_CHECKPOINT",
    "EVAL_START",
    "EVAL_BATCH_START",
    "EVAL_BEFORE_FORWARD",
    "EVAL_AFTER_FORWARD",
    "EVAL_BATCH_END",
    "EVAL_END",
    "FIT_END",
]

NOT_EVENT_METHODS = {"run_event", "close", "post_close", "state_dict", "load_state_dict"}


def test_every_spec_member_exists_and_nothing_else() -> None:
    assert [e.name for e in Event] == SPEC_MEMBERS


@pytest.mark.parametrize("name", SPEC_MEMBERS)
def test_value_is_lowercase_name(name: str) -> None:
    event = Event[name]
    assert event.value == name.lower()
    assert event == name.lower()  # a str enum: compares equal to its value
    assert isinstance(event, str)


@pytest.mark.parametrize("name", SPEC_MEMBERS)
def test_lookup_by_value_returns_the_member(name: str) -> None:
    assert Event(name.lower()) is Event[name]


def test_lookup_by_value_example() -> None:
    assert Event("batch_end") is Event.BATCH_END


def test_unknown_value_raises() -> None:
    with pytest.raises(ValueError, match="not_an_event"):
        Event("not_an_event")


# (event, is_before_event, is_after_event, canonical_name), as Composer v0.6 defines them
# (FIT_END added here closes the FIT_START pair).
PAIRS = [
    (Event.INIT, False, False, "init"),
    (Event.FIT_START, True, False, "fit"),
    (Event.EPOCH_START, True, False, "epoch"),
    (Event.BATCH_START, True, False, "batch"),
    (Event.AFTER_DATALOADER, False, False, "dataloader"),
    (Event.BEFORE_TRAIN_BATCH, True, False, "train_batch"),
    (Event.BEFORE_FORWARD, True, False, "forward"),
    (Event.AFTER_FORWARD, False, True, "forward"),
    (Event.BEFORE_LOSS, True, False, "loss"),
    (Event.AFTER_LOSS, False, True, "loss"),
    (Event.BEFORE_BACKWARD, True, False, "backward"),
    (Event.AFTER_BACKWARD, False, True, "backward"),
    (Event.AFTER_TRAIN_BATCH, False, True, "train_batch"),
    (Event.BATCH_END, False, True, "batch"),
    (Event.BATCH_CHECKPOINT, False, False, "batch_checkpoint"),
    (Event.EPOCH_END, False, True, "epoch"),
    (Event.EPOCH_CHECKPOINT, False, False, "epoch_checkpoint"),
    (Event.EVAL_START, True, False, "eval"),
    (Event.EVAL_BATCH_START, True, False, "eval_batch"),
    (Event.EVAL_BEFORE_FORWARD, True, False, "eval_forward"),
    (Event.EVAL_AFTER_FORWARD, False, True, "eval_forward"),
    (Event.EVAL_BATCH_END, False, True, "eval_batch"),
    (Event.EVAL_END, False, True, "eval"),
    (Event.FIT_END, False, True, "fit"),
]


def test_pair_table_covers_every_event() -> None:
    assert [row[0] for row in PAIRS] == list(Event)


@pytest.mark.parametrize(("event", "before", "after", "canonical"), PAIRS)
def test_pair_properties(event: Event, before: bool, after: bool, canonical: str) -> None:
    assert event.is_before_event is before
    assert event.is_after_event is after
    assert event.canonical_name == canonical


def test_every_before_event_has_an_after_event_with_its_canonical_name() -> None:
    befores = {e.canonical_name for e in Event if e.is_before_event}
    afters = {e.canonical_name for e in Event if e.is_after_event}
    assert befores == afters


def test_no_event_is_both_before_and_after() -> None:
    assert not [e for e in Event if e.is_before_event and e.is_after_event]


def test_callback_has_exactly_one_method_per_event() -> None:
    methods = {
        name
        for name, member in inspect.getmembers(trainbus.Callback, inspect.isfunction)
        if not name.startswith("_") and name not in NOT_EVENT_METHODS
    }
    assert methods == {e.value for e in Event}


@pytest.mark.parametrize("event", list(Event))
def test_callback_method_takes_state_and_logger(event: Event) -> None:
    method = getattr(trainbus.Callback, event.value)
    assert list(inspect.signature(method).parameters) == ["self", "state", "logger"]
