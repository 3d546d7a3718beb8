"""A real ``mlflow server`` on 127.0.0.1 for the tests (and the benchmark): start, stop, restart.

The server runs in a process group of its own (``mlflow server`` starts uvicorn as a
child), so :meth:`MLflowServer.stop` ends all of it. Job execution (MLflow 3's huey
workers) is turned off: the tests need only the tracking API.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

__all__ = ["MLflowServer"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MLflowServer:
    """``mlflow server`` with a sqlite store and an artifact root under ``root``."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = root
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = root / "server.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 240.0) -> None:
        """Start the server and wait until ``/health`` answers (startup takes seconds)."""
        command = [
            sys.executable, "-m", "mlflow", "server",
            "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
            "--default-artifact-root", str(self.root / "art"),
        ]
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with self.log.open("ab") as log:
            self._proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                          env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:  # polling: a process of its own has no event to wait on
            if self._proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"mlflow server not up after {timeout}s: {self.log}")
            time.sleep(0.2)

    def stop(self) -> None:
        """End the server's whole process group (SIGTERM, then SIGKILL after 10 s)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # children that outlived the parent, too
        except ProcessLookupError:
            pass
        proc.wait()
