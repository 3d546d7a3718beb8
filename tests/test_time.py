from __future__ import annotations

import copy
import math
import pickle
import threading
from typing import Any

import pytest

from trainbus.core.time import Time, TimeUnit, ensure_time
from trainbus.core.timer import Timer, Timestamp

UNITS_LISTED = "ep, ba, sp, tok, dur"


# --- time strings -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value", "unit"),
    [
        ("1ep", 1, TimeUnit.EPOCH),
        ("10ba", 10, TimeUnit.BATCH),
        ("100sp", 100, TimeUnit.SAMPLE),
        ("1000tok", 1000, TimeUnit.TOKEN),
        ("3e4tok", 30000, TimeUnit.TOKEN),
        ("3e10sp", 3 * 10**10, TimeUnit.SAMPLE),
        ("2.0ep", 2, TimeUnit.EPOCH),
        ("0ba", 0, TimeUnit.BATCH),
        ("0.5dur", 0.5, TimeUnit.DURATION),
        ("1dur", 1.0, TimeUnit.DURATION),
        (".25dur", 0.25, TimeUnit.DURATION),
        ("  7ba\n", 7, TimeUnit.BATCH),
        ("12345678901234567890ba", 12345678901234567890, TimeUnit.BATCH),
    ],
)
def test_from_timestring_valid(text: str, value: float, unit: TimeUnit) -> None:
    t = Time.from_timestring(text)
    assert t.value == value
    assert t.unit is unit
    expected_type = float if unit is TimeUnit.DURATION else int
    assert type(t.value) is expected_type


@pytest.mark.parametrize(
    "text",
    ["1epoch", "ep", "", "   ", "1.5ep", "-1ba", "-0.5dur", "abc", "10", "1e400tok", "1x", "ba10"],
)
def test_from_timestring_invalid_names_units(text: str) -> None:
    with pytest.raises(ValueError) as info:
        Time.from_timestring(text)
    message = str(info.value)
    assert repr(text) in message
    assert UNITS_LISTED in message
    assert "'10ba'" in message  # an example of a valid string


def test_from_timestring_fraction_says_why() -> None:
    with pytest.raises(ValueError, match="whole epochs"):
        Time.from_timestring("1.5ep")


@pytest.mark.parametrize("bad", [10, 1.5, None, b"10ba"])
def test_from_timestring_rejects_non_str(bad: Any) -> None:
    with pytest.raises(TypeError, match="str"):
        Time.from_timestring(bad)


@pytest.mark.parametrize("text", ["1ep", "10ba", "100sp", "3e4tok", "0.5dur"])
def test_timestring_round_trip(text: str) -> None:
    t = Time.from_timestring(text)
    assert Time.from_timestring(t.to_timestring()) == t
    assert str(t) == t.to_timestring()


# --- Time ---------------------------------------------------------------------------------


def test_constructors_and_repr() -> None:
    assert Time.from_epoch(2) == Time(2, TimeUnit.EPOCH)
    assert Time.from_batch(3) == Time(3, "ba")
    assert Time.from_sample(4) == Time(4, "sp")
    assert Time.from_token(5) == Time(5, "tok")
    assert Time.from_duration(0.5) == Time(0.5, "dur")
    assert repr(Time(10, "ba")) == "Time(10, TimeUnit.BATCH)"
    assert str(Time(10, "ba")) == "10ba"
    assert Time[int](3, "ba").value == 3


def test_bad_unit_and_value() -> None:
    with pytest.raises(ValueError, match=UNITS_LISTED):
        Time(1, "epoch")
    with pytest.raises(TypeError):
        Time(True, "ep")
    with pytest.raises(TypeError):
        Time("1", "ep")  # type: ignore[type-var]


def test_time_is_immutable_and_hashable() -> None:
    t = Time(3, "ba")
    with pytest.raises(AttributeError):
        t._value = 4
    with pytest.raises(AttributeError):
        t.value = 4  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del t._value
    assert {Time(3, "ba"), Time(3, "ba"), Time(3.0, "ba")} == {t}
    assert pickle.loads(pickle.dumps(t)) == t
    assert copy.deepcopy(t) == t


def test_arithmetic_same_unit() -> None:
    a, b = Time(10, "ba"), Time(4, "ba")
    assert a + b == Time(14, "ba")
    assert a - b == Time(6, "ba")
    assert a + 1 == Time(11, "ba")
    assert 1 + a == Time(11, "ba")
    assert a - 1 == Time(9, "ba")
    assert 12 - a == Time(2, "ba")
    assert a * 2 == Time(20, "ba")
    assert 2 * a == Time(20, "ba")
    assert a / 4 == 2.5
    assert (a / 4).unit is TimeUnit.BATCH
    assert a / b == pytest.approx(2.5)
    assert isinstance(a / b, float)
    assert type((a + b).value) is int
    assert (a * 0.5).unit is TimeUnit.BATCH


def test_comparison_same_unit_and_numbers() -> None:
    a, b = Time(1, "ep"), Time(2, "ep")
    assert a < b
    assert a <= b
    assert b > a
    assert b >= a
    assert a != b
    assert a == Time(1, "ep")
    assert a == 1
    assert a != 2
    assert a < 1.5
    assert a != "1ep"  # strings are not parsed in comparisons


@pytest.mark.parametrize(
    "op",
    [
        lambda x, y: x + y,
        lambda x, y: x - y,
        lambda x, y: x / y,
        lambda x, y: x < y,
        lambda x, y: x <= y,
        lambda x, y: x > y,
        lambda x, y: x >= y,
    ],
)
def test_mixed_units_raise_type_error_naming_both(op: Any) -> None:
    with pytest.raises(TypeError) as info:
        op(Time(1, "ep"), Time(1, "ba"))
    assert "ep" in str(info.value)
    assert "ba" in str(info.value)


def test_equality_across_units_is_false_not_an_error() -> None:
    # issue 12.8: Time(1, "ep") == Time(3, "ba") used to raise TypeError
    assert (Time(1, "ep") == Time(3, "ba")) is False
    assert (Time(1, "ep") != Time(1, "ba")) is True
    assert Time(1, "ep") in {Time(1, "ba"), Time(1, "ep")}
    assert {Time(1, "ep"): "a", Time(1, "ba"): "b"}[Time(1, "ba")] == "b"
    assert [Time(2, "sp"), Time(1, "ba")].index(Time(1, "ba")) == 1


@pytest.mark.parametrize(("value", "unit"), [(1.5, "ep"), (0.5, "ba"), (2.25, "sp"), (1.1, "tok")])
def test_fractional_counts_are_rejected_like_the_string_form(value: float, unit: str) -> None:
    # issue 12.8: Time(1.5, "ep") was accepted while "1.5ep" is rejected
    with pytest.raises(ValueError, match=r"counts whole .*use an int.*'dur'"):
        Time(value, unit)
    with pytest.raises(ValueError, match="whole"):
        Time.from_timestring(f"{value}{unit}")


def test_whole_floats_become_ints_and_durations_stay_floats() -> None:
    assert type(Time(3.0, "ep").value) is int
    assert Time(3.0, "ep") == Time(3, "ep")
    assert Time(0.5, "dur").value == 0.5


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("unit", ["ep", "ba", "dur"])
def test_non_finite_values_are_rejected(value: float, unit: str) -> None:
    with pytest.raises(ValueError, match="finite"):
        Time(value, unit)


def test_ensure_time_rejects_fractional_counts_from_arithmetic() -> None:
    with pytest.raises(ValueError, match=r"eval_interval=.*fractional.*'0.5dur'"):
        ensure_time(Time(1, "ep") * 0.5, name="eval_interval")
    assert ensure_time(Time(2, "ep") * 0.5, name="x") == Time(1, "ep")


def test_unsupported_operands() -> None:
    t = Time(1, "ep")
    with pytest.raises(TypeError):
        t * t  # type: ignore[operator]
    with pytest.raises(TypeError):
        t + "1ep"  # type: ignore[operator]
    with pytest.raises(TypeError):
        assert t < None


def test_int_and_float_conversion() -> None:
    assert int(Time(7, "ba")) == 7
    assert float(Time(7, "ba")) == 7.0
    assert int(Time(0.75, "dur")) == 0
    assert not hasattr(Time, "__index__")


# --- ensure_time --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (3, Time(3, "ep")),
        (0, Time(0, "ep")),
        ("500ba", Time(500, "ba")),
        ("0.5dur", Time(0.5, "dur")),
        (Time(10, "sp"), Time(10, "sp")),
    ],
)
def test_ensure_time_valid(given: Any, expected: Time[Any]) -> None:
    result = ensure_time(given, name="max_duration")
    assert result == expected
    assert result.unit is expected.unit


@pytest.mark.parametrize(
    ("given", "error"),
    [
        (True, TypeError),
        (1.5, TypeError),
        (None, TypeError),
        (-1, ValueError),
        ("xep", ValueError),
        ("1epoch", ValueError),
        (Time(-1, "ba"), ValueError),
    ],
)
def test_ensure_time_invalid_names_argument(given: Any, error: type[Exception]) -> None:
    with pytest.raises(error) as info:
        ensure_time(given, name="max_duration")
    message = str(info.value)
    assert "max_duration" in message
    assert "ep" in message  # says what would work


def test_ensure_time_default_name() -> None:
    with pytest.raises(ValueError, match="duration"):
        ensure_time("nope")


# --- Timestamp ----------------------------------------------------------------------------


def test_timestamp_counters_are_times() -> None:
    ts = Timestamp(epoch=1, batch=3, batch_in_epoch=1, sample=96, sample_in_epoch=32, token=5)
    assert ts.epoch == Time(1, TimeUnit.EPOCH)
    assert ts.batch == Time(3, TimeUnit.BATCH)
    assert ts.batch_in_epoch.unit is TimeUnit.BATCH
    assert ts.sample == Time(96, "sp")
    assert ts.sample_in_epoch.unit is TimeUnit.SAMPLE
    assert ts.token == Time(5, "tok")
    assert ts.token_in_epoch == Time(0, "tok")
    assert ts.get("ba") == Time(3, "ba")
    assert ts.get(TimeUnit.EPOCH) == Time(1, "ep")
    assert ts.get_timestamp() is ts
    with pytest.raises(ValueError, match="dur"):
        ts.get("dur")


def test_timestamp_compares_with_time() -> None:
    ts = Timestamp(epoch=2, batch=10)
    assert ts >= Time(2, "ep")
    assert ts > Time(9, "ba")
    assert ts < Time(3, "ep")
    assert ts <= Time(10, "ba")
    assert ts == Time(10, "ba")
    assert Time(2, "ep") <= ts  # reflected
    assert ts == Timestamp(epoch=2, batch=10)
    assert ts != Timestamp(epoch=2, batch=11)
    assert hash(ts) == hash(Timestamp(epoch=2, batch=10))


def test_timestamp_is_immutable() -> None:
    ts = Timestamp(batch=1)
    with pytest.raises(AttributeError):
        ts.batch = Time(2, "ba")  # type: ignore[misc]
    with pytest.raises(AttributeError):
        ts._batch = 2
    with pytest.raises(AttributeError):
        ts.extra = 1
    assert ts.batch == 1


def test_timestamp_copy_state_dict_pickle() -> None:
    ts = Timestamp(epoch=1, batch=5, sample=160)
    changed = ts.copy(batch=6)
    assert changed.batch == 6
    assert changed.sample == 160
    assert ts.batch == 5
    assert Timestamp(**ts.state_dict()) == ts
    assert ts.state_dict()["sample"] == 160
    assert pickle.loads(pickle.dumps(ts)) == ts
    assert "batch=5" in repr(ts)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"batch": -1}, ValueError),
        ({"batch": True}, TypeError),
        ({"epoch": Time(1, "ba")}, ValueError),
    ],
)
def test_timestamp_validates(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        Timestamp(**kwargs)


def test_timestamp_accepts_times_of_matching_unit() -> None:
    assert Timestamp(epoch=Time(2, "ep")).epoch == 2


# --- Timer --------------------------------------------------------------------------------


def test_snapshot_keeps_old_values() -> None:
    timer = Timer()
    before = timer.snapshot()
    timer.on_batch_complete(samples=8, tokens=100)
    assert before.batch == 0
    assert before.sample == 0
    assert timer.batch == 1
    assert timer.snapshot() is timer.get_timestamp()
    assert timer.snapshot() is timer.snapshot()  # O(1): no copy until the next change


def test_timer_counters_across_two_epochs() -> None:
    timer = Timer()
    for _epoch in range(2):
        for _batch in range(3):
            timer.on_batch_complete(samples=4, tokens=10)
        end_of_epoch = timer.snapshot()
        timer.on_epoch_complete()
    assert end_of_epoch.batch_in_epoch == 3
    assert end_of_epoch.sample_in_epoch == 12
    assert timer.epoch == Time(2, "ep")
    assert timer.batch == Time(6, "ba")
    assert timer.batch_in_epoch == Time(0, "ba")
    assert timer.sample == Time(24, "sp")
    assert timer.sample_in_epoch == Time(0, "sp")
    assert timer.token == Time(60, "tok")
    assert timer.token_in_epoch == Time(0, "tok")
    assert timer.get("tok") == 60
    assert int(timer.batch) == 6


def test_timer_comparisons_and_identity() -> None:
    timer = Timer()
    timer.on_epoch_complete()
    timer.on_epoch_complete()
    assert timer >= Time(2, "ep")
    assert timer > Time(1, "ep")
    assert timer == Time(2, "ep")
    assert timer.epoch == 2
    other = Timer(timer.snapshot())
    assert other != timer  # Timers compare by identity
    assert timer == timer
    assert len({timer, other}) == 2  # hashable


def test_timer_state_dict_round_trip() -> None:
    timer = Timer()
    timer.on_batch_complete(samples=3, tokens=7)
    timer.on_epoch_complete()
    timer.on_batch_complete(samples=3)
    state = timer.state_dict()
    assert state == {
        "epoch": 1,
        "batch": 2,
        "batch_in_epoch": 1,
        "sample": 6,
        "sample_in_epoch": 3,
        "token": 7,
        "token_in_epoch": 0,
    }
    restored = Timer()
    restored.load_state_dict(state)
    assert restored.snapshot() == timer.snapshot()
    restored.reset()
    assert restored.snapshot() == Timestamp()
    with pytest.raises(ValueError, match="unknown"):
        restored.load_state_dict({"epochs": 1})


def test_on_batch_complete_validates() -> None:
    timer = Timer()
    with pytest.raises(ValueError):
        timer.on_batch_complete(samples=-1)
    with pytest.raises(TypeError):
        timer.on_batch_complete(samples=1.5)  # type: ignore[arg-type]
    timer.on_batch_complete(samples=Time(4, "sp"), tokens=Time(9, "tok"))
    assert timer.sample == 4
    assert timer.token == 9
    with pytest.raises(ValueError):
        timer.on_batch_complete(samples=Time(4, "tok"))


def test_snapshots_are_safe_across_threads() -> None:
    timer = Timer()
    seen: list[Timestamp] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            ts = timer.snapshot()
            seen.append(ts)

    thread = threading.Thread(target=reader)
    thread.start()
    for _ in range(2000):
        timer.on_batch_complete(samples=2)
    done.set()
    thread.join()
    # Every snapshot is internally consistent, whenever it was taken.
    assert all(int(ts.sample) == 2 * int(ts.batch) for ts in seen)


# --- Composer's Time and Timestamp API (issue 31) ----------------------------------------------


@pytest.mark.parametrize(
    ("time", "negated"),
    [(Time(3, "ba"), Time(-3, "ba")), (Time(0.25, "dur"), Time(-0.25, "dur")),
     (Time(0, "ep"), Time(0, "ep"))],
)  # fmt: skip
def test_unary_minus_plus_and_abs_keep_the_unit(time: Time[Any], negated: Time[Any]) -> None:
    assert -time == negated and (-time).unit is time.unit
    assert +time is time
    assert abs(-time) == abs(time) == time
    assert Time(5, "ba") + -Time(2, "ba") == Time(3, "ba")


def test_timestamp_follows_the_named_tuple_protocol_of_composers() -> None:
    ts = Timestamp(epoch=1, batch=5, batch_in_epoch=2, sample=20, sample_in_epoch=8,
                   token=100, token_in_epoch=40)  # fmt: skip
    fields = ("epoch", "batch", "batch_in_epoch", "sample", "sample_in_epoch", "token",
              "token_in_epoch")  # fmt: skip
    assert Timestamp._fields == ts._fields == fields
    as_dict = ts._asdict()
    assert list(as_dict) == list(fields)
    assert as_dict["batch_in_epoch"] == Time(2, "ba") and as_dict["token"] == Time(100, "tok")
    assert [time.value for time in ts] == [1, 5, 2, 20, 8, 100, 40]  # Composer reads .value
    assert len(ts) == 7 and ts[1] == Time(5, "ba") and ts[-1] == Time(40, "tok")
    assert ts[:2] == (Time(1, "ep"), Time(5, "ba"))
    epoch, batch, *_ = ts
    assert (epoch, batch) == (Time(1, "ep"), Time(5, "ba"))
    assert Timestamp._make(ts) == ts and Timestamp._make(as_dict.values()) == ts
    assert ts._replace(batch=6).batch == Time(6, "ba") and ts.batch == Time(5, "ba")
    with pytest.raises(TypeError, match=r"Timestamp._make takes 7 counters .* got 2"):
        Timestamp._make([1, 2])


def test_the_timers_snapshot_is_still_one_reference() -> None:
    timer = Timer()
    timer.on_batch_complete(samples=4)
    assert timer.snapshot() is timer.snapshot() is timer.get_timestamp()
    assert list(timer.snapshot()._asdict().values())[1] == Time(1, "ba")
