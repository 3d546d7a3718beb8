"""Public exceptions, warnings and types show as ``trainbus.X`` (issue 12.10)."""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

import trainbus
from trainbus import callbacks, loggers

REPO = Path(__file__).resolve().parents[1]

EXCEPTIONS = [
    (trainbus, "TrainbusError"),
    (trainbus, "EngineThreadError"),
    (trainbus, "FitInProgressError"),
    (trainbus, "CallbackSignatureError"),
    (trainbus, "TrainbusWarning"),
    (trainbus, "SlowCallbackWarning"),
    (callbacks, "StreamOverflowError"),
    (loggers, "MetricsUploadWarning"),
    (loggers, "TrackingServerError"),
]


@pytest.mark.parametrize(("module", "name"), EXCEPTIONS)
def test_exceptions_print_as_their_public_module(module: object, name: str) -> None:
    cls = getattr(module, name)
    public = module.__name__  # type: ignore[attr-defined]
    assert cls.__module__ == public
    line = traceback.format_exception_only(cls("boom"))[-1]
    assert line == f"{public}.{name}: boom\n"
    assert "_exceptions" not in repr(cls)
    again = pickle.loads(pickle.dumps(cls("boom")))  # found again under the public name
    assert type(again) is cls
    assert again.args == ("boom",)


@pytest.mark.parametrize("name", ["Time", "TimeUnit", "LogLevel", "LogRecord", "Logger",
                                  "LoggerDestination"])
def test_public_types_show_as_trainbus(name: str) -> None:
    cls = getattr(trainbus, name)
    assert cls.__module__ == "trainbus"
    assert importlib.import_module(cls.__module__).__dict__[name] is cls
    assert repr(cls) == f"<class 'trainbus.{name}'>" or repr(cls).startswith("<enum ")


def test_pickling_times_and_levels_still_works() -> None:
    value = (trainbus.Time(3, "ba"), trainbus.TimeUnit.EPOCH, trainbus.LogLevel.BATCH,
             trainbus.LogRecord({"x": 1.0}, 3, 0.0))
    assert pickle.loads(pickle.dumps(value)) == value


def test_an_uncaught_error_prints_the_public_name() -> None:
    code = "import trainbus; raise trainbus.FitInProgressError('already fitting')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == "trainbus.FitInProgressError: already fitting"
