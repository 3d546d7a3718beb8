"""Logger and LoggerDestination: copies, tensors, default steps, levels, async destinations."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

from tests.helpers import TinyModel, make_trainer
from trainbus import (
    Callback,
    CallbackSignatureError,
    Logger,
    LoggerDestination,
    LogLevel,
    LogRecord,
    State,
    UnknownHandlerWarning,
    blocking,
    trailing,
)
from trainbus.loggers import InMemoryLogger


def _values(dest: InMemoryLogger, name: str) -> list[Any]:
    return [value for _, _, value in dest.data[name]]


# --- values are copied when logged ------------------------------------------------------------


class MutatesAfterLogging(Callback):
    """Logs a dict, then changes everything it logged, in the same handler."""

    def batch_end(self, state: Any, logger: Logger) -> None:
        history = [1, 2]
        metrics: dict[str, Any] = {"history": history, "count": 1.0}
        logger.log_metrics(metrics)
        history.append(3)
        metrics["count"] = 99.0
        metrics["added_later"] = 5.0


def test_log_metrics_copies_the_dict_and_its_values() -> None:
    dest = InMemoryLogger()
    make_trainer(n_batches=2, callbacks=[MutatesAfterLogging()], loggers=[dest]).fit_sync()
    assert _values(dest, "history") == [[1, 2], [1, 2]]
    assert _values(dest, "count") == [1.0, 1.0]
    assert "added_later" not in dest.data


class LogsTensors(Callback):
    def __init__(self) -> None:
        self.originals: list[torch.Tensor] = []

    def batch_end(self, state: Any, logger: Logger) -> None:
        scalar = torch.tensor(2.5)
        one = torch.tensor([1.5])
        vector = torch.arange(3.0, requires_grad=True)
        logger.log_metrics({"scalar": scalar, "one": one, "vector": vector})
        self.originals.append(vector)
        with torch.no_grad():  # change every tensor in place after logging it
            scalar.add_(10)
            one.add_(10)
            vector.add_(10)


def test_tensors_arrive_as_floats_or_cpu_copies() -> None:
    dest = InMemoryLogger()
    cb = LogsTensors()
    make_trainer(n_batches=1, callbacks=[cb], loggers=[dest]).fit_sync()
    (scalar,) = _values(dest, "scalar")
    (one,) = _values(dest, "one")
    (vector,) = _values(dest, "vector")
    assert type(scalar) is float
    assert scalar == 2.5
    assert type(one) is float
    assert one == 1.5
    assert isinstance(vector, torch.Tensor)
    assert vector.device.type == "cpu"
    assert vector.tolist() == [0.0, 1.0, 2.0]  # the in-place change did not reach it
    assert vector is not cb.originals[0]
    assert not vector.requires_grad


# --- the default step -------------------------------------------------------------------------


class LateLogger(Callback):
    """Its handler for batch 1 waits until training has reached batch 3, then logs."""

    def __init__(self, gate: threading.Event, live: list[State]) -> None:
        self.gate = gate
        self.live = live
        self.live_batch_when_logging: int | None = None

    # It reads only its snapshot: declared trailing, it may run through later batches'
    # compute (without the declaration the live fence would hold batch 2 for it).
    @trailing(10)
    async def batch_end(self, state: Any, logger: Logger) -> None:
        if int(state.timer.batch) == 1:
            opened = await anyio.to_thread.run_sync(self.gate.wait, 30.0)
            assert opened, "training never reached batch 3"
            self.live_batch_when_logging = int(self.live[0].timer.batch)
        logger.log_metrics({"late": float(state.timer.batch)})
        logger.log_metrics({"explicit": 1.0}, step=100 + int(state.timer.batch))


class OpenAtBatch3(Callback):
    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate

    @blocking
    def batch_end(self, state: Any, logger: Logger) -> None:
        if int(state.timer.batch) == 3:
            self.gate.set()


def test_default_step_is_the_handlers_event_batch_even_when_it_runs_late() -> None:
    gate = threading.Event()
    live: list[State] = []
    late = LateLogger(gate, live)
    dest = InMemoryLogger()
    trainer = make_trainer(
        n_batches=4,
        callbacks=[late, OpenAtBatch3(gate)],
        loggers=[dest],
        barriers=(),
    )
    live.append(trainer.state)
    trainer.fit_sync()
    assert late.live_batch_when_logging is not None
    assert late.live_batch_when_logging >= 3  # it did run late...
    assert dest.steps["late"] == [1, 2, 3, 4]  # ...and still logged at its own batch
    assert [int(ts.batch) for ts, _, _ in dest.data["late"]] == [1, 2, 3, 4]
    assert dest.steps["explicit"] == [101, 102, 103, 104]


# --- argument errors --------------------------------------------------------------------------


@pytest.fixture
def logger() -> Logger:
    model = TinyModel()
    return Logger(State(model=model, max_duration="1ep"))


@pytest.mark.parametrize("bad", [[("loss", 1.0)], 1.0, "loss", None])
def test_log_metrics_rejects_a_non_mapping_naming_the_argument(logger: Logger, bad: Any) -> None:
    with pytest.raises(TypeError, match=r"metrics") as info:
        logger.log_metrics(bad)
    assert type(bad).__qualname__ in str(info.value)


@pytest.mark.parametrize("bad", [[1.0], lambda: [1.0]])
def test_data_rejects_a_non_mapping_naming_the_argument(logger: Logger, bad: Any) -> None:
    with pytest.raises(TypeError, match=r"data"):
        logger.data("batch", bad)


def test_bad_level_names_the_valid_ones(logger: Logger) -> None:
    with pytest.raises(ValueError, match=r"'fit', 'epoch', 'batch'"):
        logger.log_metrics({"x": 1.0}, level="hourly")
    with pytest.raises(ValueError, match=r"'fit', 'epoch', 'batch'"):
        logger.data(7, {"x": 1.0})


def test_keys_must_be_str_and_a_collision_is_named(logger: Logger) -> None:
    # issue 12.8: {1: 1.0, "1": 2.0} used to keep one value silently
    with pytest.raises(TypeError, match=r"must be str.*1 and '1' would both be named '1'"):
        logger.log_metrics({1: 1.0, "1": 2.0})
    with pytest.raises(TypeError, match=r"must be str.*use str keys"):
        logger.log_metrics({("a", "b"): 1.0})
    with pytest.raises(TypeError, match=r"log_hyperparameters.*must be str"):
        logger.log_hyperparameters({0.1: "lr"})


@pytest.mark.parametrize("bad", [1.7, 2.0, "3", True, float("nan")])
def test_step_must_be_an_int(logger: Logger, bad: Any) -> None:
    # issue 12.8: step=1.7 used to be logged as step 1
    with pytest.raises(TypeError, match=r"step=.*must be an int"):
        logger.log_metrics({"x": 1.0}, step=bad)


def test_integral_steps_are_accepted() -> None:
    import numpy as np

    from trainbus import Time

    dest = InMemoryLogger()

    class Steps(Callback):
        def fit_start(self, state: Any, logger: Logger) -> None:
            logger.log_metrics({"x": 1.0}, step=5)
            logger.log_metrics({"x": 2.0}, step=np.int64(6))
            logger.log_metrics({"x": 3.0}, step=torch.tensor(7))
            logger.log_metrics({"x": 4.0}, step=Time(8, "ba"))

    make_trainer(n_batches=1, callbacks=[Steps()], loggers=[dest], log_train_loss=False).fit_sync()
    assert dest.steps["x"] == [5, 6, 7, 8]
    assert all(type(step) is int for step in dest.steps["x"])


# --- hyperparameters, async destinations ------------------------------------------------------


class LogsHparams(Callback):
    def fit_start(self, state: Any, logger: Logger) -> None:
        params = {"lr": 0.1, "layers": [4, 3]}
        logger.log_hyperparameters(params)
        params["layers"].append(99)  # copied: the destinations do not see this


class SyncDest(LoggerDestination):
    def __init__(self) -> None:
        self.hparams: list[dict[str, Any]] = []
        self.metrics: list[tuple[int, dict[str, Any]]] = []

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        self.metrics.append((step, metrics))

    def log_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        self.hparams.append(hyperparameters)


def test_log_hyperparameters_reaches_every_destination() -> None:
    memory, custom = InMemoryLogger(), SyncDest()
    make_trainer(n_batches=1, callbacks=[LogsHparams()], loggers=[memory, custom]).fit_sync()
    assert memory.hyperparameters == {"lr": 0.1, "layers": [4, 3]}
    assert custom.hparams == [{"lr": 0.1, "layers": [4, 3]}]
    assert all("lr" not in m for _, m in custom.metrics)  # not mixed into metrics


class AsyncDest(LoggerDestination):
    def __init__(self) -> None:
        self.metrics: list[tuple[int, dict[str, Any]]] = []
        self.hparams: list[dict[str, Any]] = []

    async def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        await anyio.sleep(0)
        self.metrics.append((step, metrics))

    async def log_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        await anyio.sleep(0)
        self.hparams.append(hyperparameters)


class LogsEachBatch(Callback):
    def batch_end(self, state: Any, logger: Logger) -> None:
        logger.log_metrics({"batch": int(state.timer.batch)})


@pytest.mark.anyio
async def test_async_destination_receives_metrics_in_order() -> None:
    dest = AsyncDest()
    trainer = make_trainer(
        n_batches=3,
        callbacks=[LogsHparams(), LogsEachBatch()],
        loggers=[dest],
        log_train_loss=False,
    )
    await trainer.fit()
    assert dest.metrics == [(1, {"batch": 1}), (2, {"batch": 2}), (3, {"batch": 3})]
    assert dest.hparams == [{"lr": 0.1, "layers": [4, 3]}]


class RecordDest(LoggerDestination):
    def __init__(self) -> None:
        self.records: list[LogRecord] = []

    def log_record(self, record: LogRecord) -> None:
        self.records.append(record)


def test_log_record_gets_level_timestamp_and_wall_time() -> None:
    class Levels(Callback):
        def epoch_end(self, state: Any, logger: Logger) -> None:
            logger.log_metrics({"e": 1.0}, level="epoch")
            logger.data_fit({"f": 2.0})

    dest = RecordDest()
    make_trainer(n_batches=2, callbacks=[Levels()], loggers=[dest], log_train_loss=False).fit_sync()
    (epoch_rec, fit_rec) = dest.records
    assert (epoch_rec.metrics, epoch_rec.level, epoch_rec.step) == ({"e": 1.0}, LogLevel.EPOCH, 2)
    assert (fit_rec.metrics, fit_rec.level) == ({"f": 2.0}, LogLevel.FIT)
    assert epoch_rec.timestamp is not None
    assert int(epoch_rec.timestamp.epoch) == 1
    assert epoch_rec.wall_time > 0
    assert not epoch_rec.hyperparameters


# --- LogLevel ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("batch", LogLevel.BATCH),
        ("BATCH", LogLevel.BATCH),
        ("Epoch", LogLevel.EPOCH),
        ("fit", LogLevel.FIT),
        (1, LogLevel.FIT),
        (2, LogLevel.EPOCH),
        (3, LogLevel.BATCH),
        (LogLevel.EPOCH, LogLevel.EPOCH),
    ],
)
def test_loglevel_accepts_names_and_numbers(given: Any, expected: LogLevel) -> None:
    assert LogLevel(given) is expected


def test_loglevel_lookup_by_member_name() -> None:
    assert LogLevel["EPOCH"] is LogLevel.EPOCH


def test_loglevel_order_is_composers() -> None:
    assert LogLevel.FIT < LogLevel.EPOCH < LogLevel.BATCH
    assert (int(LogLevel.FIT), int(LogLevel.EPOCH), int(LogLevel.BATCH)) == (1, 2, 3)


@pytest.mark.parametrize("bad", ["hourly", 0, 9, None, 2.5])
def test_loglevel_rejects_unknown_levels(bad: Any) -> None:
    with pytest.raises(ValueError, match="not a LogLevel"):
        LogLevel(bad)


# --- Composer v0.6's log_data, and the methods trainbus would not call (issue 31) -------------


class AsyncLogData(LoggerDestination):
    """An ``async def log_data``: awaited on the loop, with Composer's arguments."""

    def __init__(self) -> None:
        self.got: list[tuple[int, LogLevel, dict[str, Any]]] = []

    async def log_data(self, state: State, log_level: LogLevel, data: dict[str, Any]) -> None:
        await anyio.sleep(0)
        self.got.append((int(state.timer.batch), log_level, data))


class LogsHyperparameters(Callback):
    def fit_start(self, state: Any, logger: Logger) -> None:
        logger.log_hyperparameters({"lr": 0.1})

    def batch_end(self, state: Any, logger: Logger) -> None:
        logger.log_metrics({"b": int(state.timer.batch)})


def test_async_log_data_gets_every_record_hyperparameters_at_fit_level() -> None:
    dest = AsyncLogData()
    make_trainer(n_batches=2, callbacks=[LogsHyperparameters()], loggers=[dest],
                 log_train_loss=False).fit_sync()  # fmt: skip
    assert dest.got == [
        (0, LogLevel.FIT, {"lr": 0.1}),
        (1, LogLevel.BATCH, {"b": 1}),
        (2, LogLevel.BATCH, {"b": 2}),
    ]


def test_the_record_carries_the_state_of_its_event() -> None:
    dest = InMemoryLogger()

    class Records(LoggerDestination):
        def __init__(self) -> None:
            self.states: list[Any] = []

        def log_record(self, record: LogRecord) -> None:
            self.states.append(record.state)

    records = Records()
    trainer = make_trainer(n_batches=2, loggers=[dest, records])
    trainer.fit_sync()
    batches = [int(s.timer.batch) for s in records.states]
    assert batches == [1, 2]  # loss/train of batch n, logged with the state of batch n
    assert all(s.model is trainer.state.model for s in records.states)  # live objects


class BothEntryPoints(LoggerDestination):
    def log_data(self, state: State, log_level: LogLevel, data: dict[str, Any]) -> None:
        pass

    def log_record(self, record: LogRecord) -> None:
        pass

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        pass


class LogDataCallsLogMetrics(LoggerDestination):
    def __init__(self) -> None:
        self.got: list[int] = []

    def log_data(self, state: State, log_level: LogLevel, data: dict[str, Any]) -> None:
        self.log_metrics(dict(data), int(state.timer.batch))

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        self.got.append(step)


class LogRecordCallsSuper(LoggerDestination):
    def log_record(self, record: LogRecord) -> None:
        super().log_record(record)

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        pass


class ComposerFilters(LoggerDestination):
    def will_log(self, state: State, log_level: LogLevel) -> bool:
        return log_level <= LogLevel.EPOCH

    def log_metric(self, timestamp: Any, log_level: LogLevel, data: dict[str, Any]) -> None:
        pass


def test_log_data_takes_every_record_and_names_the_methods_left_uncalled() -> None:
    with pytest.warns(UnknownHandlerWarning) as caught:
        make_trainer(loggers=[BothEntryPoints()])
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 2
    assert messages[0].startswith(
        "BothEntryPoints.log_metrics is never called: BothEntryPoints "
        "defines log_data, which receives every record instead"
    )
    assert messages[1].startswith("BothEntryPoints.log_record is never called")
    assert all(w.filename == __file__ for w in caught)  # points at the methods


def test_composer_methods_trainbus_never_calls_are_named() -> None:
    with pytest.warns(UnknownHandlerWarning) as caught:
        make_trainer(loggers=[ComposerFilters()])
    messages = sorted(str(w.message) for w in caught)
    assert [m.split(" is never")[0] for m in messages] == [
        "ComposerFilters.log_metric", "ComposerFilters.will_log",
    ]  # fmt: skip
    assert "rename it to log_data(self, state, log_level, data)" in messages[0]
    assert "drop unwanted levels in log_data" in messages[1]


def test_entry_points_that_call_the_other_methods_do_not_warn() -> None:
    calls = LogDataCallsLogMetrics()
    make_trainer(n_batches=2, loggers=[calls, LogRecordCallsSuper()]).fit_sync()  # no warning
    assert calls.got == [1, 2]


def test_logger_run_name_and_destinations() -> None:
    memory, calls = InMemoryLogger(), LogDataCallsLogMetrics()
    trainer = make_trainer(loggers=[memory, calls], run_name="named")
    assert trainer.logger.run_name == "named"
    assert trainer.logger.destinations == (memory, calls)


class ArtifactDestination(LoggerDestination):
    def log_file_artifact(self, state: State, log_level: LogLevel, artifact_name: str,
                          file_path: Any, *, overwrite: bool) -> None:  # fmt: skip
        pass


class UploadsAnArtifact(Callback):
    def fit_start(self, state: Any, logger: Logger) -> None:
        Path("config.yaml").write_text("lr: 0.1\n")
        logger.file_artifact(LogLevel.FIT, "{run_name}/config.yaml", "config.yaml")
        logger.symlink_artifact(LogLevel.FIT, "{run_name}/config.yaml", "latest.yaml")


def test_artifacts_are_stored_under_the_run_folder_with_one_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Issue 54: Composer's ``logger.file_artifact`` stores the file under
    ``<run_name>/artifacts`` (no destination receives artifacts: one note says where); a
    destination's ``log_file_artifact`` is still never called, and says so."""
    monkeypatch.chdir(tmp_path)
    warned = (
        r"ArtifactDestination.log_file_artifact is never called by trainbus: "
        r"logger.file_artifact\(...\) stores each file under <run_name>/artifacts itself"
    )
    with pytest.warns(UnknownHandlerWarning, match=warned):
        make_trainer(loggers=[ArtifactDestination()])
    trainer = make_trainer(callbacks=[UploadsAnArtifact()], loggers=[InMemoryLogger()],
                           run_name="art")  # fmt: skip
    trainer.fit_sync()
    folder = tmp_path / "art" / "artifacts"
    assert (folder / "art" / "config.yaml").read_text() == "lr: 0.1\n"
    assert (folder / "latest.yaml").is_symlink()
    assert (folder / "latest.yaml").read_text() == "lr: 0.1\n"
    err = capfd.readouterr().err
    assert err.count(f"logger.file_artifact stores artifacts under {folder}/") == 1
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        trainer.logger.file_artifact(LogLevel.FIT, "art/config.yaml", "config.yaml")
    with pytest.raises(ValueError, match="inside the run's artifact folder"):
        trainer.logger.file_artifact(LogLevel.FIT, "../x", "config.yaml")
    with pytest.raises(FileNotFoundError, match="store it first"):
        trainer.logger.symlink_artifact(LogLevel.FIT, "missing", "latest.yaml")


class ComposerV04LogData(LoggerDestination):
    def log_data(self, timestamp: Any, data: dict[str, Any]) -> None:  # one argument short
        pass


def test_a_log_data_that_cannot_take_composers_arguments_is_refused_at_construction() -> None:
    with pytest.raises(CallbackSignatureError, match=r"ComposerV04LogData.log_data\(timestamp"
                       r".*expected `def log_data\(self, state, log_level, data\)`"):  # fmt: skip
        make_trainer(loggers=[ComposerV04LogData()])
