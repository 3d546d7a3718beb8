"""InMemoryLogger: what Composer's returns from ``get_timeseries``."""

from __future__ import annotations

from tests.helpers import make_trainer
from trainbus import Timestamp
from trainbus.loggers import InMemoryLogger


def test_get_timeseries_has_a_list_per_timestamp_field_as_composers() -> None:
    memory = InMemoryLogger()
    make_trainer(n_batches=2, epochs=2, loggers=[memory]).fit_sync()
    series = memory.get_timeseries("loss/train")
    assert set(series) == {"loss/train", "step", *Timestamp._fields}
    assert {"batch_in_epoch", "sample_in_epoch", "token_in_epoch"} <= set(series)
    assert series["batch"] == series["step"] == [1, 2, 3, 4]
    assert series["batch_in_epoch"] == [1, 2, 1, 2]
    assert series["sample_in_epoch"] == [4, 8, 4, 8]
    assert series["token_in_epoch"] == [0, 0, 0, 0]
    assert all(len(values) == 4 for values in series.values())
