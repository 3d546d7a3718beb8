"""Shared parts of the failure-path tests (issue 12): a bounded runner, releasable
"sleeps", close recorders, a metrics server on 127.0.0.1, and file/thread checks.

Every scenario runs through :func:`run_bounded`: ``anyio.run`` on a thread of its own,
joined with a safety bound. A scenario that hangs (the bug these tests guard against)
fails its test with a message instead of tripping pytest-timeout, which would end the
whole session; its releasable sleeps are released so that stuck threads can end.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from trainbus import Callback

__all__ = [
    "BOUND",
    "CloseOrder",
    "Outcome",
    "Points",
    "Probe",
    "Sleeps",
    "SmallServer",
    "closing",
    "jsonl_points",
    "release_and_join",
    "run_bounded",
    "server_fixture",
    "spooled_points",
    "trainbus_threads",
]

BOUND = 30.0  # seconds: a safety bound against hangs only, never a timing claim


@dataclass
class Outcome:
    """How a scenario ended: its return value or its exception, and how long it took."""

    value: Any = None
    error: BaseException | None = None
    elapsed: float = 0.0


class Sleeps:
    """"Sleeps for an hour" that the test releases at its end (so no thread leaks)."""

    def __init__(self) -> None:
        self._events: list[threading.Event] = []
        self.entered = threading.Event()

    def hour(self) -> None:
        """Block the calling thread until :meth:`release_all` (an hour at most)."""
        event = threading.Event()
        self._events.append(event)
        self.entered.set()
        event.wait(3600)

    def release_all(self) -> None:
        for event in self._events:
            event.set()


def run_bounded(
    scenario: Callable[[], Awaitable[Any]],
    backend: str,
    *,
    bound: float = BOUND,
    sleeps: Sleeps | None = None,
) -> Outcome:
    """Run ``scenario`` under ``anyio.run`` on a thread; fail the test if it hangs."""
    import anyio

    outcome = Outcome()

    def main() -> None:
        start = time.monotonic()
        try:
            outcome.value = anyio.run(scenario, backend=backend)
        except BaseException as exc:  # the scenario's outcome, whatever it is
            outcome.error = exc
        finally:
            outcome.elapsed = time.monotonic() - start

    runner = threading.Thread(target=main, name="test-scenario", daemon=True)
    runner.start()
    runner.join(bound)
    if runner.is_alive():
        if sleeps is not None:
            sleeps.release_all()
        runner.join(5.0)
        pytest.fail(f"the scenario did not return within the safety bound of {bound:g} s (hang)")
    return outcome


def trainbus_threads(*, allow: tuple[str, ...] = ()) -> list[str]:
    """Names of live ``trainbus-*`` threads, except those in ``allow``."""
    return [
        t.name
        for t in threading.enumerate()
        if t.name.startswith("trainbus-") and t.name not in allow and t.is_alive()
    ]


def release_and_join(sleeps: Sleeps, names: tuple[str, ...], timeout: float = 10.0) -> list[str]:
    """Release every stuck "sleep", join the threads called ``names`` (bounded), and
    return what those threads raised on their way out (``"name: error"``)."""
    raised: list[str] = []
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread is not None else "?"
        raised.append(f"{name}: {args.exc_type.__name__}: {args.exc_value}")

    threading.excepthook = hook
    try:
        sleeps.release_all()
        for thread in threading.enumerate():
            if thread.name in names:
                thread.join(timeout)
    finally:
        threading.excepthook = previous
    return raised


class CloseOrder:
    """A shared, ordered record of ``close`` / ``post_close`` calls (any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: list[tuple[str, str]] = []

    def add(self, what: str, who: str) -> None:
        with self._lock:
            self.calls.append((what, who))

    def count(self, what: str, who: str) -> int:
        return sum(1 for call in self.calls if call == (what, who))

    def assert_complete(self, names: list[str]) -> None:
        """Each name closed once and post-closed once, every post_close after every close."""
        for name in names:
            assert self.count("close", name) == 1, (name, self.calls)
            assert self.count("post_close", name) == 1, (name, self.calls)
        closes = [i for i, (what, who) in enumerate(self.calls) if what == "close" and who in names]
        posts = [i for i, (what, who) in enumerate(self.calls) if what == "post_close"]
        if closes and posts:
            assert max(closes) < min(posts), self.calls


def closing(kind: str, name: str, order: CloseOrder) -> type[Callback]:
    """A callback class ``name`` whose ``close``/``post_close`` (``kind`` "sync" or
    "async") record themselves in ``order``."""
    if kind == "async":

        async def aclose(self: Any, state: Any, logger: Any) -> None:
            order.add("close", name)

        async def apost(self: Any) -> None:
            order.add("post_close", name)

        return type(name, (Callback,), {"close": aclose, "post_close": apost})

    def close(self: Any, state: Any, logger: Any) -> None:
        order.add("close", name)

    def post(self: Any) -> None:
        order.add("post_close", name)

    return type(name, (Callback,), {"close": close, "post_close": post})


class Probe(Callback):
    """Logs ``probe`` at every ``batch_end`` and counts the calls that returned.

    Every point it counts was accepted by the logger before anything else happened to
    the run, so each one must be in every destination afterwards.
    """

    def __init__(self, out: Callable[[str], None] | None = None) -> None:
        self.logged: list[int] = []
        self.out = out

    def batch_end(self, state: Any, logger: Any) -> None:
        step = int(state.timer.batch)
        logger.log_metrics({"probe": float(step)})
        self.logged.append(step)
        if self.out is not None:
            self.out(f"logged {step}")


Points = list[tuple[str, int]]


def jsonl_points(path: Path, name: str = "probe") -> list[int]:
    """Steps of ``name`` in a JSON-lines file; every line must parse."""
    if not path.exists():
        return []
    steps = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            point = json.loads(line)
        except json.JSONDecodeError:  # pragma: no cover - the failure message
            raise AssertionError(f"{path}:{number} does not parse: {line!r}") from None
        if point["name"] == name:
            steps.append(int(point["step"]))
    return steps


def spooled_points(directory: Path, name: str = "probe") -> list[int]:
    """Steps of ``name`` in an uploader's spool (undelivered, not refused, batches)."""
    if not directory.exists():
        return []
    steps = []
    for path in sorted(directory.glob("batch-*.json")):
        if path.name.endswith(".rejected.json"):
            continue
        body = json.loads(path.read_text())["body"]
        steps += [int(p["step"]) for p in body["points"] if p["name"] == name]
    return steps


# -- a metrics server ----------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.owner.receive(self.headers.get("Idempotency-Key", ""), json.loads(raw))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: SmallServer


@dataclass
class SmallServer:
    """A metrics endpoint on 127.0.0.1 that accepts every batch (first body per key)."""

    accepted: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/metrics"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.01,), name="test-metrics", daemon=True
        )
        self._thread.start()

    def receive(self, key: str, body: Any) -> None:
        with self._lock:
            self.accepted.setdefault(key, body)

    def points(self, name: str = "probe") -> list[int]:
        with self._lock:
            return [
                int(p["step"])
                for body in self.accepted.values()
                for p in body["points"]
                if p["name"] == name
            ]

    def close(self) -> None:
        self._server.shutdown()
        self._thread.join()
        self._server.server_close()


def server_fixture() -> Iterator[SmallServer]:
    server = SmallServer()
    try:
        yield server
    finally:
        server.close()
