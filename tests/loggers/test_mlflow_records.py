"""MLflowLogger's record path: off the event loop, one loop wake-up per request, every value
type encoded as MLflow reads it, and batches spooled by the earlier format still resent.

Against the session's real ``mlflow server`` (conftest.py); points are read back with
MLflow's own client.
"""

from __future__ import annotations

import math
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers import make_trainer
from tests.loggers.mlflow_server import MLflowServer
from tests.loggers.test_mlflow import FAST, client, history
from trainbus import Callback, LogRecord
from trainbus.loggers import MLflowLogger
from trainbus.loggers._spool import Batch, Spool


def experiment() -> str:
    return f"records-{uuid.uuid4().hex[:8]}"


class TenPerBatch(Callback):
    """10 metrics per batch; notes the event loop's thread (an ``async`` handler runs there)."""

    loop_thread: int | None = None

    async def fit_start(self, state: Any, logger: Any) -> None:
        self.loop_thread = threading.get_ident()

    def batch_end(self, state: Any, logger: Any) -> None:
        batch = int(state.timer.batch)
        logger.log_metrics({f"m{i}": batch + i / 10 for i in range(10)})


class Watched(MLflowLogger):
    """Notes on which threads records are encoded, and the loop's takes that found items."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.encoded_on: set[int] = set()
        self.takes = 0

    def _items(self, record: LogRecord) -> list[Any]:
        self.encoded_on.add(threading.get_ident())
        return super()._items(record)

    def _take(self) -> None:
        if self._inbox.pending:
            self.takes += 1
        super()._take()


def test_records_are_encoded_off_the_loop_which_wakes_once_per_request(
    mlflow_server: MLflowServer,
) -> None:
    # 20 records of 10 points, 50 points per request: the loop takes the records' points
    # when a request's worth has come (4 times; flush_seconds is longer than the run),
    # not once per record, and never encodes a record itself.
    ten = TenPerBatch()
    mlflow_logger = Watched(mlflow_server.url, experiment_name=experiment(), batch_size=50,
                            flush_seconds=60, backoff=0.01)
    make_trainer(20, callbacks=[ten], loggers=[mlflow_logger], log_train_loss=False).fit_sync()
    assert ten.loop_thread is not None
    assert mlflow_logger.encoded_on
    assert ten.loop_thread not in mlflow_logger.encoded_on
    assert 1 <= mlflow_logger.takes <= 5  # 4 wake-ups, maybe a last take at close
    stats = mlflow_logger.statistics()
    assert (stats.batches_sent, stats.points_sent, stats.pending_points) == (4, 200, 0)
    assert mlflow_logger.run_id is not None
    assert sum(history(mlflow_server, mlflow_logger.run_id).values()) == 200


def test_every_number_type_arrives_as_mlflow_reads_it(mlflow_server: MLflowServer) -> None:
    values: dict[str, Any] = {
        "float": 0.1, "int": 3, "big_int": 2**70, "np_float": np.float64(2.5),
        "np_int": np.int64(-4), "tensor": torch.tensor(1.5), "inf": math.inf,
        "minus_inf": -math.inf, "tiny": 5e-324, "bool": True, "text": "not a number",
    }

    class Log(Callback):
        def fit_start(self, state: Any, logger: Any) -> None:
            logger.log_metrics(values, step=7)

    mlflow_logger = MLflowLogger(mlflow_server.url, experiment_name=experiment(), **FAST)
    make_trainer(1, callbacks=[Log()], loggers=[mlflow_logger], log_train_loss=False).fit_sync()
    assert mlflow_logger.run_id is not None
    got = client(mlflow_server).get_run(mlflow_logger.run_id).data.metrics
    top = sys.float_info.max  # what MLflow's SQL store keeps of an infinity
    assert got == {"float": 0.1, "int": 3.0, "big_int": float(2**70), "np_float": 2.5,
                   "np_int": -4.0, "tensor": 1.5, "inf": top, "minus_inf": -top,
                   "tiny": 5e-324}
    assert mlflow_logger.statistics().skipped_values == 2  # bool and text are not points


def test_a_batch_spooled_in_the_earlier_format_is_still_resent(
    mlflow_server: MLflowServer, tmp_path: Path
) -> None:
    # Before points were encoded as JSON text, a spooled batch held one dict per point.
    name = experiment()
    mlflow = client(mlflow_server)
    run_id = mlflow.create_run(mlflow.create_experiment(name)).info.run_id
    old = [{"key": "old", "value": float(step), "timestamp": 1_700_000_000_000, "step": step}
           for step in range(3)]
    Spool(tmp_path).write(Batch(key=str(uuid.uuid4()), points=old, run=run_id))
    mlflow_logger = MLflowLogger(mlflow_server.url, experiment_name=name, spool_dir=tmp_path,
                                 **FAST)
    make_trainer(1, loggers=[mlflow_logger], log_train_loss=False).fit_sync()
    assert mlflow_logger.statistics().recovered_batches == 1
    assert history(mlflow_server, run_id) == {("old", s, float(s)): 1 for s in range(3)}
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("batch_size", [1, 7, 1000])
def test_points_of_any_batching_arrive_exactly_once(
    mlflow_server: MLflowServer, batch_size: int
) -> None:
    mlflow_logger = MLflowLogger(mlflow_server.url, experiment_name=experiment(),
                                 batch_size=batch_size, **FAST)
    make_trainer(6, callbacks=[TenPerBatch()], loggers=[mlflow_logger],
                 log_train_loss=False).fit_sync()
    assert mlflow_logger.run_id is not None
    expected = {(f"m{i}", b, b + i / 10): 1 for b in range(1, 7) for i in range(10)}
    assert history(mlflow_server, mlflow_logger.run_id) == expected
