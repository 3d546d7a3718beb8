"""Shared fixtures: every ``@pytest.mark.anyio`` test runs under asyncio and trio."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def no_leaked_threads() -> Iterator[None]:
    """Fail the test if a trainbus thread is still alive after it."""
    yield
    alive = [t.name for t in threading.enumerate() if t.name.startswith("trainbus-")]
    assert not alive, f"threads outlived the test: {alive}"
