"""Fixtures of the logger tests: one real ``mlflow server`` per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.loggers.mlflow_server import MLflowServer


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MLflowServer]:
    """A tracking server shared by the session (starting one takes tens of seconds)."""
    server = MLflowServer(tmp_path_factory.mktemp("mlflow"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
