"""MLflowLogger against a real ``mlflow server`` (one per session, see conftest.py).

Points are read back with MLflow's own client (``MlflowClient().get_metric_history``).
"""

from __future__ import annotations

import json
import math
import threading
import uuid
import warnings
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.helpers import make_trainer
from tests.loggers.mlflow_server import MLflowServer
from trainbus import Callback
from trainbus.loggers import (
    InMemoryLogger,
    MetricsUploadWarning,
    MLflowLogger,
    TrackingServerError,
)


@pytest.fixture(autouse=True)
def _no_mlflow_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_TOKEN", "MLFLOW_EXPERIMENT_NAME",
                 "MLFLOW_TRACKING_USERNAME"):
        monkeypatch.delenv(name, raising=False)


FAST = {"backoff": 0.01, "max_backoff": 0.2, "flush_seconds": 0.05}


def client(server: MLflowServer) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=server.url)


def history(server: MLflowServer, run_id: str) -> Counter[tuple[str, int, float]]:
    """(key, step, value) of every metric point the server has for the run."""
    mlflow = client(server)
    keys = mlflow.get_run(run_id).data.metrics
    return Counter(
        (key, point.step, point.value)
        for key in keys
        for point in mlflow.get_metric_history(run_id, key)
    )


def logged(memory: InMemoryLogger) -> Counter[tuple[str, int, float]]:
    """(key, step, value) of every numeric point an InMemoryLogger saw."""
    return Counter(
        (name, step, float(value))
        for name, rows in memory.data.items()
        for (_, _, value), step in zip(rows, memory.steps[name], strict=True)
        if isinstance(value, int | float) and not isinstance(value, bool)
    )


class LogExtras(Callback):
    """Hyperparameters at the start, two metrics per batch and one per epoch."""

    def fit_start(self, state: Any, logger: Any) -> None:
        logger.log_hyperparameters({"lr": 0.1, "optimizer": "sgd", "layers": 2})

    def batch_end(self, state: Any, logger: Any) -> None:
        batch = int(state.timer.batch)
        logger.log_metrics({"a": batch * 0.5, "b": float(batch) ** 2, "note": "skipped"})

    def epoch_end(self, state: Any, logger: Any) -> None:
        logger.log_metrics({"epoch/mark": float(state.timer.epoch)})


def experiment() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.mark.anyio
async def test_two_epochs_of_metrics_and_params_arrive_exactly_once(
    anyio_backend: str, mlflow_server: MLflowServer
) -> None:
    name = experiment()
    mlflow_logger = MLflowLogger(mlflow_server.url, experiment_name=name, tags={"team": "x"},
                                 batch_size=7, **FAST)  # several batches per epoch
    memory = InMemoryLogger()
    trainer = make_trainer(10, 2, callbacks=[LogExtras()], loggers=[memory, mlflow_logger],
                           run_name="two-epochs")
    await trainer.fit()

    run_id = mlflow_logger.run_id
    assert run_id is not None
    expected = logged(memory)
    assert sum(expected.values()) == 20 * 3 + 2  # loss, a, b per batch; a mark per epoch
    assert history(mlflow_server, run_id) == expected
    run = client(mlflow_server).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "two-epochs"
    assert run.data.params == {"lr": "0.1", "optimizer": "sgd", "layers": "2"}
    assert run.data.tags["team"] == "x"
    assert client(mlflow_server).get_experiment(run.info.experiment_id).name == name
    stats = mlflow_logger.statistics()
    assert stats.points_sent == sum(expected.values()) + 3  # the params are items too
    assert stats.skipped_values == 20  # "note" is not a number


def test_a_run_that_raises_ends_failed_with_its_points(mlflow_server: MLflowServer) -> None:
    class Boom(Callback):
        def batch_end(self, state: Any, logger: Any) -> None:
            if int(state.timer.batch) == 4:
                raise RuntimeError("boom")

    mlflow_logger = MLflowLogger(mlflow_server.url, experiment_name=experiment(), **FAST)
    memory = InMemoryLogger()
    with pytest.raises(RuntimeError, match="boom"):
        make_trainer(10, callbacks=[Boom()], loggers=[memory, mlflow_logger]).fit_sync()
    assert mlflow_logger.run_id is not None
    assert client(mlflow_server).get_run(mlflow_logger.run_id).info.status == "FAILED"
    assert history(mlflow_server, mlflow_logger.run_id) == logged(memory)


@pytest.mark.anyio
async def test_a_cancelled_fit_ends_the_run_failed(
    anyio_backend: str, mlflow_server: MLflowServer
) -> None:
    class CancelAt(Callback):
        def __init__(self, scope: anyio.CancelScope) -> None:
            self.scope = scope

        async def batch_end(self, state: Any, logger: Any) -> None:
            if int(state.timer.batch) == 3:
                self.scope.cancel()

    mlflow_logger = MLflowLogger(mlflow_server.url, experiment_name=experiment(), **FAST)
    memory = InMemoryLogger()
    with anyio.CancelScope() as scope:
        await make_trainer(100, callbacks=[CancelAt(scope)],
                           loggers=[memory, mlflow_logger]).fit()
    assert scope.cancelled_caught
    assert mlflow_logger.run_id is not None
    assert client(mlflow_server).get_run(mlflow_logger.run_id).info.status == "FAILED"
    assert history(mlflow_server, mlflow_logger.run_id) == logged(memory)


def test_a_second_fit_continues_the_same_run_and_experiments_are_reused(
    mlflow_server: MLflowServer,
) -> None:
    name = experiment()
    first = MLflowLogger(mlflow_server.url, experiment_name=name, **FAST)
    memory = InMemoryLogger()
    trainer = make_trainer(3, loggers=[memory, first])
    trainer.fit_sync()
    trainer.fit_sync(duration="1ep")
    assert first.run_id is not None
    assert history(mlflow_server, first.run_id) == logged(memory)
    assert sum(logged(memory).values()) == 6
    second = MLflowLogger(mlflow_server.url, experiment_name=name, **FAST)
    make_trainer(1, loggers=[second]).fit_sync()
    assert second.experiment_id == first.experiment_id
    assert second.run_id != first.run_id


def test_requests_stay_within_mlflows_limits(mlflow_server: MLflowServer) -> None:
    # One log_metrics of 2500 values and 250 hyperparameters: MLflow answers 400 to a
    # request of more than 1000 metrics or 100 params, so this arrives only if split.
    class Wide(Callback):
        def fit_start(self, state: Any, logger: Any) -> None:
            logger.log_hyperparameters({f"p{i}": i for i in range(250)})
            logger.log_metrics({f"m{i}": float(i) for i in range(2500)}, step=0)
            logger.log_metrics({"nan": float("nan"), "big": 1e300}, step=1)

    mlflow_logger = MLflowLogger(mlflow_server.url, experiment_name=experiment(), **FAST)
    make_trainer(1, callbacks=[Wide()], loggers=[mlflow_logger], log_train_loss=False).fit_sync()
    run_id = mlflow_logger.run_id
    assert run_id is not None
    run = client(mlflow_server).get_run(run_id)
    assert len(run.data.params) == 250
    assert len(run.data.metrics) == 2502
    assert run.data.metrics["m2499"] == 2499.0
    assert run.data.metrics["nan"] != run.data.metrics["nan"]  # NaN arrives as NaN
    stats = mlflow_logger.statistics()
    assert stats.rejected_batches == 0
    assert stats.batches_sent == 3 + 3  # 100+100+50 params; 1000+1000+502 metrics


def test_names_mlflow_refuses_are_renamed_not_lost(mlflow_server: MLflowServer) -> None:
    class Odd(Callback):
        def fit_start(self, state: Any, logger: Any) -> None:
            logger.log_hyperparameters({"opt(lr)": 0.1})
            logger.log_metrics({"acc@1": 0.5, "ok/name-1.x": 1.0}, step=1)

    mlflow_logger = MLflowLogger(mlflow_server.url, experiment_name=experiment(), **FAST)
    with pytest.warns(MetricsUploadWarning, match=r"\{'opt\(lr\)': 'opt_lr_', 'acc@1': 'acc_1'\}"):
        make_trainer(1, callbacks=[Odd()], loggers=[mlflow_logger],
                     log_train_loss=False).fit_sync()
    assert mlflow_logger.run_id is not None
    run = client(mlflow_server).get_run(mlflow_logger.run_id)
    assert run.data.metrics == {"acc_1": 0.5, "ok/name-1.x": 1.0}
    assert run.data.params == {"opt_lr_": "0.1"}
    assert mlflow_logger.statistics().rejected_batches == 0


def test_tracking_uri_and_token_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[dict[str, str]] = []

    class Refuse(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            body = json.dumps({"error_code": "UNAUTHENTICATED", "message": "bad token"})
            self.send_response(401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{server.server_address[1]}")
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "s3cret")
        mlflow_logger = MLflowLogger(**FAST)
        with warnings.catch_warnings(record=True) as caught, \
                pytest.raises(TrackingServerError, match=r"HTTP 401.*MLFLOW_TRACKING_TOKEN"):
            warnings.simplefilter("always", MetricsUploadWarning)  # what training logged
            make_trainer(2, loggers=[mlflow_logger]).fit_sync()  # before it stopped is lost
        assert all("opening the run" in str(w.message) for w in caught)
    finally:
        server.shutdown()
        server.server_close()
    assert seen[0]["authorization"] == "Bearer s3cret"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "MLFLOW_TRACKING_URI"),
        ({"tracking_uri": "file:///tmp/mlruns"}, "tracking_uri=.*http"),
        ({"tracking_uri": "http://127.0.0.1:1", "batch_size": 1001}, "batch_size=.*1000"),
        ({"tracking_uri": "http://127.0.0.1:1", "timeout": 0}, "timeout="),
    ],
)
def test_bad_arguments_name_the_fix(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], match: str
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(ValueError, match=match):
        MLflowLogger(**kwargs)


# Last in the file: it restarts the session's server (on the same port and store).
@pytest.mark.slow  # restarting mlflow server takes tens of seconds on a loaded machine
def test_server_stopped_mid_run_and_restarted_loses_nothing(
    mlflow_server: MLflowServer, tmp_path: Path
) -> None:
    restarted = threading.Event()
    errors: list[BaseException] = []

    def restart() -> None:
        try:
            mlflow_server.start()
        except BaseException as exc:  # reported by the test below
            errors.append(exc)
        finally:
            restarted.set()

    class Outage(Callback):
        def batch_end(self, state: Any, logger: Any) -> None:  # plain: training waits
            batch = int(state.timer.batch)
            if batch == 5:
                mlflow_server.stop()  # down from batch 5 on
            elif batch == 15:
                threading.Thread(target=restart, daemon=True).start()  # up during close

    mlflow_logger = MLflowLogger(mlflow_server.url, experiment_name=experiment(),
                                 spool_dir=tmp_path / "spool", close_timeout=300,
                                 batch_size=4, backoff=0.05, max_backoff=0.5,
                                 flush_seconds=0.05)
    memory = InMemoryLogger()
    trainer = make_trainer(20, callbacks=[LogExtras(), Outage()],
                           loggers=[memory, mlflow_logger],
                           # close waits for the restart on purpose (tens of seconds on a
                           # loaded machine): that wait is this test's subject, not a hang
                           wait_warning_seconds=math.inf)
    try:
        trainer.fit_sync()
    finally:
        restarted.wait(300)
    assert errors == []
    run_id = mlflow_logger.run_id
    assert run_id is not None
    assert mlflow_logger.statistics().retries > 0
    assert history(mlflow_server, run_id) == logged(memory)
    assert client(mlflow_server).get_run(run_id).info.status == "FINISHED"
    assert list((tmp_path / "spool").iterdir()) == []
