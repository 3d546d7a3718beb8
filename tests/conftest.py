"""Shared fixtures: every ``@pytest.mark.anyio`` test runs under asyncio and trio; one real
``mlflow server`` per session (for tests/loggers/test_mlflow.py and docs/loggers.md)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from tests.loggers.mlflow_server import MLflowServer

# The suite's fits (and the processes they start) are quiet: no default progress output, no
# end-of-fit table, no ``time/...`` metrics, as a CI job would set it. The tests of the
# default output (tests/test_time_account.py, tests/test_default_output.py) unset it.
os.environ["TRAINBUS_PROGRESS"] = "0"


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def no_leaked_threads() -> Iterator[None]:
    """Fail the test if a trainbus thread is still alive after it."""
    yield
    alive = [t.name for t in threading.enumerate() if t.name.startswith("trainbus-")]
    assert not alive, f"threads outlived the test: {alive}"


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MLflowServer]:
    """A tracking server shared by the session (starting one takes tens of seconds)."""
    server = MLflowServer(tmp_path_factory.mktemp("mlflow"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
