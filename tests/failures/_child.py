"""A child process for the Ctrl-C tests: its stdout and stderr read by threads, lines
awaited with a bound, SIGINT sent on cue."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import trainbus

__all__ = ["Child", "child_env"]

SRC = Path(trainbus.__file__).resolve().parents[1]  # the trainbus under test


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PYTHONWARNINGS", None)
    return env


class Child:
    """``python <args>`` with its output collected line by line."""

    def __init__(
        self, args: Sequence[str], cwd: Path, env: dict[str, str] | None = None
    ) -> None:
        self.interrupted: float | None = None
        self.proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=cwd,
            env={**child_env(), **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._lines: queue.Queue[tuple[str, str]] = queue.Queue()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(name, stream, sink), daemon=True)
            for name, stream, sink in (("out", self.proc.stdout, self.out),
                                       ("err", self.proc.stderr, self.err))
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, name: str, stream: IO[str], sink: list[str]) -> None:
        for line in stream:
            sink.append(line.rstrip("\n"))
            self._lines.put((name, line.rstrip("\n")))
        self._lines.put((name, ""))  # EOF marker (an empty line is never printed)

    def wait_for(
        self, stream: str, match: Callable[[str], bool], bound: float = 120.0, *, kill: bool = True
    ) -> str:
        """The first new line on ``stream`` ("out"/"err") that matches; fails on timeout/EOF."""
        deadline = time.monotonic() + bound
        eof = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                if kill:
                    self.kill()
                raise AssertionError(f"no matching line on std{stream} in {bound} s\n{self}")
            try:
                name, line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if line == "":
                eof += 1
                if eof == 2:
                    raise AssertionError(f"the child ended before the expected line\n{self}")
                continue
            if name == stream and match(line):
                return line

    def saw(self, stream: str, match: Callable[[str], bool], bound: float) -> bool:
        """Whether a new line on ``stream`` matches within ``bound`` s (no failure)."""
        try:
            self.wait_for(stream, match, bound, kill=False)
        except AssertionError:
            return False
        return True

    def interrupt(self) -> None:
        """Send SIGINT (a Ctrl-C); the first one starts the clock of :meth:`finish`."""
        if self.interrupted is None:
            self.interrupted = time.monotonic()
        self.proc.send_signal(signal.SIGINT)

    def finish(self, bound: float) -> tuple[int, float]:
        """Wait for the exit, killing the child (a hang) past ``bound``; returns its exit
        status (that of the kill, after a hang) and the seconds since the first SIGINT."""
        try:
            status = self.proc.wait(bound)
        except subprocess.TimeoutExpired:
            self.kill()
            status = self.proc.returncode
        elapsed = time.monotonic() - (self.interrupted or time.monotonic())
        self.close()
        assert self.interrupted is not None, "finish() waits for an interrupted child"
        return status, elapsed

    def close(self) -> None:
        """Let the readers reach the end of the output, then close the pipes."""
        for reader in self._readers:
            reader.join(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            self.proc.wait()

    def __str__(self) -> str:
        out = "\n".join(self.out[-10:])
        err = "\n".join(self.err[-30:])
        return f"--- stdout (tail) ---\n{out}\n--- stderr (tail) ---\n{err}"
