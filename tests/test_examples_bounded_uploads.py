"""``examples/bounded_uploads.py`` runs against its local service, on asyncio and trio.

Its three variants send every batch's loss; the bounded one never has more requests at
the service than it allows. (Its ms/batch figures are printed, not asserted: timing
claims belong to ``benchmarks/``.)
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import pytest

from tests.helpers import make_trainer

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "bounded_uploads.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bounded_uploads", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_runs_as_a_script() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--batches", "10", "--latency-ms", "10", "--batch-ms", "2"],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "10 batches of 2 ms, one 10 ms POST per batch:"
    names = [line.split("  ")[1].strip() for line in lines[1:5]]
    assert names == [
        "no uploads",
        "await each POST, trailing(2)",
        "logged, HTTPMetricsUploader batches",
        "task group, 8 in flight",
    ]
    assert all(line.rstrip().endswith("ms/batch") for line in lines[1:5])


@pytest.mark.anyio
@pytest.mark.parametrize("limit", [1, 3])
async def test_bounded_uploads_never_exceed_their_limit_and_close_waits_for_them(
    anyio_backend: str, limit: int
) -> None:
    example = load()
    n = 30
    with example.Service(latency_ms=10) as service:
        async with example.BoundedUploads(service.url, max_in_flight=limit) as uploads:
            closed_with: list[int] = []

            class Watch(example.BoundedUploads):  # type: ignore[misc,name-defined]
                async def close(self, state: Any, logger: Any) -> None:
                    await super().close(state, logger)
                    closed_with.append(service.server.answered)

            uploads.__class__ = Watch
            await make_trainer(n, callbacks=[uploads]).fit()
            assert closed_with == [n]  # close returned once every request was answered
        assert uploads.sent == n
        assert 1 <= service.peak <= limit
        if limit > 1:
            assert uploads.peak_in_flight > 1  # requests did overlap


@pytest.mark.anyio
async def test_a_failed_request_fails_the_run(anyio_backend: str) -> None:
    example = load()
    import httpx

    with pytest.raises(BaseException) as caught:
        async with example.BoundedUploads("http://127.0.0.1:9/nowhere") as uploads:
            with anyio.fail_after(30):
                await make_trainer(5, callbacks=[uploads]).fit()
    errors = (
        caught.value.exceptions if isinstance(caught.value, BaseExceptionGroup) else [caught.value]
    )
    assert any(isinstance(e, httpx.ConnectError) for e in errors), errors


def test_bad_limit() -> None:
    example = load()
    with pytest.raises(ValueError, match=r"max_in_flight=0 must be an int >= 1, e\.g\. 8"):
        example.BoundedUploads("http://127.0.0.1:1/", max_in_flight=0)
