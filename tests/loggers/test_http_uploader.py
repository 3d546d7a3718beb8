"""HTTPMetricsUploader against real HTTP servers on 127.0.0.1 (stdlib, in threads)."""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

from tests.helpers import make_trainer
from trainbus import Callback
from trainbus.loggers import HTTPMetricsUploader, InMemoryLogger, MetricsUploadWarning
from trainbus.loggers._delivery import retry_after
from trainbus.loggers._spool import Batch, Spool

REPO = Path(__file__).resolve().parents[2]
FAST = {"backoff": 0.001, "max_backoff": 0.01, "flush_seconds": 0.05}
SLOW_FLUSH = {**FAST, "flush_seconds": 60.0}  # batches sealed only when full, and by close


# -- a metrics server ----------------------------------------------------------------------


@dataclass
class Reply:
    """What the server does with one request."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    accept: bool = True  # store the points (before answering, or before dropping)
    drop: bool = False  # close the connection without a response


OK = Reply()


@dataclass
class Request:
    key: str
    body: Any
    headers: dict[str, str]
    reply: Reply
    at: float
    note: Any = None


Policy = Callable[[int, "Request"], Reply]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else each answer waits ~40 ms for a delayed ACK
    server: _HTTPServer

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if len(raw) < length:  # the client went away mid-body (a killed process): as a real
            self.close_connection = True  # server does, record nothing and answer nothing
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        reply = self.server.owner.receive(headers, json.loads(raw or b"null"))
        if reply.drop:
            self.close_connection = True
            return
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:
        pass


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    owner: MetricsServer


class MetricsServer:
    """Records every POST; ``accepted`` keeps the first body per ``Idempotency-Key``.

    With ``listen=False`` the port is bound but not listening (connections are refused)
    until :meth:`listen`.
    """

    def __init__(self, policy: Policy | None = None, *, listen: bool = True) -> None:
        self.policy = policy
        self.requests: list[Request] = []
        self.accepted: dict[str, Any] = {}
        self.conflicts: list[str] = []
        self.changed = threading.Condition()
        self._server = _HTTPServer(("127.0.0.1", 0), _Handler, bind_and_activate=False)
        self._server.owner = self
        self._server.server_bind()
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self._thread: threading.Thread | None = None
        if listen:
            self.listen()

    def listen(self) -> None:
        self._server.server_activate()
        serve = self._server.serve_forever
        self._thread = threading.Thread(target=serve, args=(0.01,), daemon=True)
        self._thread.start()

    def receive(self, headers: dict[str, str], body: Any) -> Reply:
        with self.changed:
            request = Request(headers.get("idempotency-key", ""), body, headers, OK, time.time())
            reply = self.policy(len(self.requests), request) if self.policy else OK
            request.reply = reply
            self.requests.append(request)
            if reply.accept and 200 <= reply.status < 300:
                first = self.accepted.setdefault(request.key, body)
                if first != body:
                    self.conflicts.append(request.key)
            self.changed.notify_all()
        return reply

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        with self.changed:
            return self.changed.wait_for(predicate, timeout)

    def points(self) -> Counter[tuple[str, int]]:
        """(name, step) of every accepted point, once per key."""
        return Counter(
            (p["name"], p["step"]) for body in self.accepted.values() for p in body["points"]
        )

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()


@pytest.fixture
def servers() -> Iterator[Callable[..., MetricsServer]]:
    made: list[MetricsServer] = []

    def make(*args: Any, **kwargs: Any) -> MetricsServer:
        made.append(MetricsServer(*args, **kwargs))
        return made[-1]

    yield make
    for server in made:
        server.close()


# -- training helpers ----------------------------------------------------------------------


class LogExtras(Callback):
    """Logs two numeric metrics and one string per batch, besides the trainer's loss.

    A plain handler: on a loaded machine its time (GIL waits included) can exceed the
    sub-millisecond batches of the tiny model, so trainers using it turn off the
    slow-callback warning.
    """

    def batch_end(self, state: Any, logger: Any) -> None:
        batch = int(state.timer.batch)
        logger.log_metrics({"a": batch * 0.5, "b": torch.tensor(float(batch)), "tag": "x"})


def logged_points(memory: InMemoryLogger) -> Counter[tuple[str, int]]:
    """(name, step) of every numeric value an InMemoryLogger saw."""
    return Counter(
        (name, step)
        for name, rows in memory.data.items()
        for (_, _, value), step in zip(rows, memory.steps[name], strict=True)
        if isinstance(value, int | float) and not isinstance(value, bool)
    )


def batch_files(directory: Path) -> list[Path]:
    """Spool files of undelivered batches (not temporary files, not refused batches)."""
    return sorted(p for p in directory.iterdir() if p.name.startswith("batch-")
                  and p.name.endswith(".json") and not p.name.endswith(".rejected.json"))


# -- delivery ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_flaky_server_gets_every_point_exactly_once(
    anyio_backend: str, servers: Callable[..., MetricsServer]
) -> None:
    rng = random.Random(1234)  # its first 23 draws (there are >= 23 batches) hold a drop,
    # a stored-then-dropped answer and 503s, so every failure path is taken in every run

    def flaky(n: int, request: Request) -> Reply:
        r = rng.random()
        if r < 0.05:
            return Reply(drop=True, accept=False)  # connection dropped before storing
        if r < 0.10:
            return Reply(drop=True)  # stored, but the answer is lost: the client retries
        if r < 0.40:
            return Reply(503, accept=False)
        return OK

    server = servers(flaky)
    uploader = HTTPMetricsUploader(server.url, batch_size=8, **FAST)
    memory = InMemoryLogger()
    trainer = make_trainer(60, callbacks=[LogExtras()], loggers=[memory, uploader])
    await trainer.fit()

    expected = logged_points(memory)
    assert sum(expected.values()) == 180  # loss/train, a and b for 60 batches; "tag" skipped
    assert server.points() == expected
    assert server.conflicts == []  # every retry of a key carried the same points
    replies = [r.reply for r in server.requests]
    assert any(r.drop and r.accept for r in replies)
    assert any(r.status == 503 for r in replies)
    stats = uploader.statistics()
    assert stats.points_sent == 180
    assert stats.pending_points == 0
    assert len(server.requests) == stats.batches_sent + stats.retries
    assert {body["run"] for body in server.accepted.values()} == {trainer.state.run_name}


@pytest.mark.anyio
async def test_training_never_waits_for_the_server(
    anyio_backend: str, servers: Callable[..., MetricsServer]
) -> None:
    first_arrived, fit_ended = threading.Event(), threading.Event()
    released: list[bool] = []

    def hold_first(n: int, request: Request) -> Reply:
        if n == 0:
            first_arrived.set()
            released.append(fit_ended.wait(10))  # answer only once training has ended
        return OK

    class Gate(Callback):
        def batch_end(self, state: Any, logger: Any) -> None:
            if int(state.timer.batch) == 2:
                assert first_arrived.wait(10), "the first batch never reached the server"

        def fit_end(self, state: Any, logger: Any) -> None:
            fit_ended.set()

    server = servers(hold_first)
    uploader = HTTPMetricsUploader(server.url, batch_size=1, **FAST)
    trainer = make_trainer(20, callbacks=[Gate()], loggers=[uploader])
    await trainer.fit()

    assert released == [True]  # 18 batches trained while the first request was unanswered
    assert uploader.points_sent == 20
    lane = next(c for c in trainer.engine.statistics().callbacks
                if c.name == "HTTPMetricsUploader")
    assert not lane.on_thread  # async log_record: a loop lane, no thread of its own


@pytest.mark.anyio
async def test_partial_batches_are_flushed_every_flush_interval(
    anyio_backend: str, servers: Callable[..., MetricsServer]
) -> None:
    server = servers()
    seen_during_training: list[bool] = []

    class WaitForFlush(Callback):
        def batch_end(self, state: Any, logger: Any) -> None:  # blocks training: a plain def
            if int(state.timer.batch) == 3:
                seen_during_training.append(server.wait_for(lambda: bool(server.requests)))

    uploader = HTTPMetricsUploader(server.url, batch_size=1000, **FAST)
    trainer = make_trainer(5, callbacks=[WaitForFlush()], loggers=[uploader])
    await trainer.fit()
    assert seen_during_training == [True]
    assert 1 <= len(server.requests[0].body["points"]) <= 3
    assert sum(server.points().values()) == 5


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_wire_format(anyio_backend: str, servers: Callable[..., MetricsServer]) -> None:
    class Mixed(Callback):
        def fit_start(self, state: Any, logger: Any) -> None:
            logger.log_hyperparameters({"lr": 0.1, "depth": 3})
            logger.log_metrics(
                {"int": 3, "flag": True, "none": None, "nan": float("nan"), "text": "x",
                 "vector": torch.ones(3), "scalar": torch.tensor(2.5)},
                step=7,
            )

    server = servers()
    uploader = HTTPMetricsUploader(server.url, run_name="my-run", **FAST)
    await make_trainer(1, callbacks=[Mixed()], loggers=[uploader], log_train_loss=False).fit()

    (request,) = server.requests
    assert request.headers["content-type"] == "application/json"
    assert len(request.key) == 36  # a uuid4
    assert request.body["run"] == "my-run"
    points = request.body["points"]
    assert [(p["name"], p["value"], p["step"]) for p in points] == [
        ("int", 3.0, 7), ("scalar", 2.5, 7)
    ]
    assert all(isinstance(p["value"], float) and isinstance(p["wall_time"], float)
               for p in points)
    assert uploader.statistics().skipped_values == 5


# -- spooling ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_server_down_for_the_first_half_everything_arrives_from_the_spool(
    anyio_backend: str, servers: Callable[..., MetricsServer], tmp_path: Path
) -> None:
    spool = tmp_path / "spool"

    def spooled_first(n: int, request: Request) -> Reply:
        request.note = any(request.key in p.name for p in spool.iterdir())
        return OK

    server = servers(spooled_first, listen=False)  # connections refused until listen()
    uploader = HTTPMetricsUploader(server.url, batch_size=4, spool_dir=spool, **FAST)
    while_down: dict[str, Any] = {}

    class BringUp(Callback):
        def batch_end(self, state: Any, logger: Any) -> None:  # blocks training: a plain def
            if int(state.timer.batch) != 20:
                return
            deadline = time.monotonic() + 10
            while uploader.spooled_batches < 10 or uploader.retries < 2:
                assert time.monotonic() < deadline, uploader.statistics()
                time.sleep(0.005)
            while_down["stats"] = uploader.statistics()
            while_down["files"] = [p.name for p in batch_files(spool)]
            server.listen()

    memory = InMemoryLogger()
    trainer = make_trainer(40, callbacks=[LogExtras(), BringUp()], loggers=[memory, uploader])
    await trainer.fit()

    assert while_down["stats"].points_sent == 0
    assert server.points() == logged_points(memory)
    assert server.conflicts == []
    assert all(r.note for r in server.requests)  # each batch was on disk before its 1st try
    for name in while_down["files"]:  # what was spooled while down arrived, then was deleted
        assert any(key in name for key in server.accepted)
    assert batch_files(spool) == []
    assert uploader.spooled_batches == 0


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_undelivered_at_close_stays_in_the_spool_for_the_next_uploader(
    anyio_backend: str, servers: Callable[..., MetricsServer], tmp_path: Path
) -> None:
    down = servers(listen=False)
    first = HTTPMetricsUploader(down.url, batch_size=3, spool_dir=tmp_path, close_timeout=0.2,
                                **SLOW_FLUSH)
    with pytest.warns(MetricsUploadWarning, match=r"10 points in 4 batch\(es\).*spool_dir"):
        await make_trainer(10, loggers=[first], run_name="first").fit()
    files = batch_files(tmp_path)
    assert len(files) == 4 == first.spooled_batches
    spooled = {json.loads(p.read_bytes())["idempotency_key"] for p in files}

    up = servers()
    second = HTTPMetricsUploader(up.url, batch_size=3, spool_dir=tmp_path, **SLOW_FLUSH)
    await make_trainer(2, loggers=[second], run_name="second").fit()
    assert spooled <= set(up.accepted)
    runs = Counter(body["run"] for body in up.accepted.values())
    assert runs == {"first": 4, "second": 1}
    assert sum(up.points().values()) == 12
    assert second.statistics().recovered_batches == 4
    assert batch_files(tmp_path) == []


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_without_spool_close_reports_the_points_lost(
    anyio_backend: str, servers: Callable[..., MetricsServer]
) -> None:
    down = servers(listen=False)
    uploader = HTTPMetricsUploader(down.url, batch_size=100, close_timeout=0.1, **SLOW_FLUSH)
    with pytest.warns(MetricsUploadWarning, match=r"5 points in 1 batch\(es\).*lost"):
        await make_trainer(5, loggers=[uploader]).fit()
    assert uploader.points_sent == 0
    assert uploader.retries >= 1


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_spool_that_cannot_be_written_degrades_to_memory(
    anyio_backend: str, servers: Callable[..., MetricsServer], tmp_path: Path
) -> None:
    server = servers()
    spool = tmp_path / "spool"
    uploader = HTTPMetricsUploader(server.url, batch_size=2, spool_dir=spool, **SLOW_FLUSH)
    shutil.rmtree(spool)
    spool.write_text("")  # a file where the directory was: reading it and 3 writes fail
    with pytest.warns(MetricsUploadWarning, match=r"4 spool operation\(s\) failed"):
        await make_trainer(6, loggers=[uploader]).fit()
    assert sum(server.points().values()) == 6  # sent from memory instead
    assert uploader.spooled_batches == 0


def test_spool_load_recovers_complete_temporary_files_and_sets_aside_broken_ones(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path)
    batches = [Batch(str(uuid.uuid4()), [{"name": "x", "value": float(i), "step": i,
                                          "wall_time": 0.0}], run="r", seq=i) for i in range(4)]
    for batch in batches:
        spool.write(batch)
    paths = [b.path for b in batches if b.path is not None]
    assert len(paths) == 4
    # killed after fsync, before the rename: complete, comes back
    os.replace(paths[1], tmp_path / f".tmp-0a1b-{paths[1].name}")
    # killed mid-write: truncated, dropped (never spooled, so never sent either)
    data = paths[2].read_bytes()
    (tmp_path / f".tmp-2c3d-{paths[2].name}").write_bytes(data[:-7])
    paths[2].unlink()
    paths[3].write_text("{not json")

    loaded, corrupt = spool.load()
    assert [b.key for b in loaded] == [batches[0].key, batches[1].key]
    assert loaded[1].points == batches[1].points
    assert loaded[1].body() == batches[1].body()
    assert [p.name for p in corrupt] == [paths[3].name + ".corrupt"]
    assert not list(tmp_path.glob(".tmp-*"))


CHILD = """
import socket, sys, time
from tests.helpers import make_trainer
from trainbus import Callback
from trainbus.loggers import HTTPMetricsUploader

dead = socket.socket()
dead.bind(("127.0.0.1", 0))  # bound, never listening: every connection is refused
url = f"http://127.0.0.1:{dead.getsockname()[1]}/metrics"
uploader = HTTPMetricsUploader(url, batch_size=5, spool_dir=sys.argv[1], backoff=0.01,
                               max_backoff=0.05)

class Stall(Callback):
    def batch_end(self, state, logger):
        if uploader.spooled_batches >= 3:
            print("spooled", uploader.spooled_batches, flush=True)
            time.sleep(3600)

make_trainer(2000, callbacks=[Stall()], loggers=[uploader], run_name="killed").fit_sync()
print("finished", flush=True)
"""


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_spool_left_by_a_killed_process_is_delivered_by_the_next_run(
    anyio_backend: str, servers: Callable[..., MetricsServer], tmp_path: Path
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert child.stdout is not None
    assert child.stderr is not None
    watchdog = threading.Timer(60, child.kill)
    watchdog.start()
    try:
        line = await anyio.to_thread.run_sync(child.stdout.readline)
        assert line.startswith("spooled"), (line, child.stderr.read())
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        watchdog.cancel()
        child.kill()
        child.wait()
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    left = {}
    for path in batch_files(tmp_path):
        record = json.loads(path.read_bytes())
        left[record["idempotency_key"]] = record["body"]
    assert len(left) >= 3
    # A write the kill interrupted after fsync but before the rename is recovered too.
    unrenamed = {p.name[-41:-5] for p in tmp_path.glob(".tmp-*")}  # <key>.json

    server = servers()
    uploader = HTTPMetricsUploader(server.url, batch_size=5, spool_dir=tmp_path, **FAST)
    memory = InMemoryLogger()
    await make_trainer(10, loggers=[memory, uploader], run_name="next").fit()

    for key, body in left.items():  # delivered with the key and points written before the kill
        assert server.accepted[key] == body
        assert body["run"] == "killed"
    killed = {k for k, b in server.accepted.items() if b["run"] == "killed"}
    assert killed - set(left) <= unrenamed
    own = [b for b in server.accepted.values() if b["run"] == "next"]
    assert Counter((p["name"], p["step"]) for b in own for p in b["points"]) == \
        logged_points(memory)
    assert uploader.statistics().recovered_batches == len(killed)
    assert list(tmp_path.iterdir()) == []


# -- failures ------------------------------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_retry_after_is_honoured(
    anyio_backend: str, servers: Callable[..., MetricsServer]
) -> None:
    def busy_once(n: int, request: Request) -> Reply:
        return Reply(429, {"Retry-After": "1"}, accept=False) if n == 0 else OK

    server = servers(busy_once)
    uploader = HTTPMetricsUploader(server.url, backoff=0.001, max_backoff=0.002,
                                   flush_seconds=0.05)
    await make_trainer(1, loggers=[uploader]).fit()
    first, second = server.requests
    assert first.key == second.key
    assert uploader.retries == 1
    assert second.at - first.at >= 0.95  # backoff alone would wait 2 ms at most


def test_retry_after_parsing() -> None:
    assert retry_after("3") == 3.0
    assert retry_after(None) == 0.0
    assert retry_after("soon") == 0.0
    assert retry_after("-1") == 0.0
    in_ten = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 10))
    assert 8 < retry_after(in_ten) <= 10


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_4xx_is_not_retried_and_is_reported_at_close(
    anyio_backend: str, servers: Callable[..., MetricsServer], tmp_path: Path
) -> None:
    server = servers(lambda n, request: Reply(400, accept=False))
    uploader = HTTPMetricsUploader(server.url, batch_size=2, spool_dir=tmp_path, **SLOW_FLUSH)
    with pytest.warns(MetricsUploadWarning, match=r"refused 3 batch\(es\) \(6 points.*HTTP 400"):
        await make_trainer(6, loggers=[uploader]).fit()
    assert len(server.requests) == 3 == len({r.key for r in server.requests})
    stats = uploader.statistics()
    assert (stats.retries, stats.points_sent, stats.rejected_batches) == (0, 0, 3)
    assert batch_files(tmp_path) == []
    assert len(list(tmp_path.glob("*.rejected.json"))) == 3


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
@pytest.mark.parametrize(("host", "keeps_credentials"), [("localhost", False),
                                                          ("127.0.0.1", True)])
async def test_credentials_go_only_to_the_configured_host(
    anyio_backend: str, servers: Callable[..., MetricsServer], host: str,
    keeps_credentials: bool,
) -> None:
    target = servers()
    location = f"http://{host}:{target.port}/moved"
    origin = servers(lambda n, request: Reply(307, {"Location": location}, accept=False))
    secret = {"Authorization": "Bearer s3cret", "X-Api-Key": "k3y"}
    uploader = HTTPMetricsUploader(origin.url, headers=secret, batch_size=1, **FAST)
    await make_trainer(3, loggers=[uploader]).fit()

    assert all(r.headers["authorization"] == "Bearer s3cret" for r in origin.requests)
    assert sum(target.points().values()) == 3
    assert uploader.points_sent == 3
    for request in target.requests:
        assert ("authorization" in request.headers) is keeps_credentials
        assert ("x-api-key" in request.headers) is keeps_credentials
        assert request.headers["idempotency-key"] in {r.key for r in origin.requests}


# -- construction --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"url": "ftp://example.com/"}, "url="),
        ({"url": "not a url"}, "url="),
        ({"batch_size": 0}, "batch_size="),
        ({"flush_seconds": 0}, "flush_seconds="),
        ({"timeout": -1}, "timeout="),
        ({"close_timeout": -1}, "close_timeout="),
        ({"backoff": 2.0, "max_backoff": 1.0}, "max_backoff="),
    ],
)
def test_bad_arguments_name_the_argument(kwargs: dict[str, Any], names: str) -> None:
    kwargs = {"url": "http://127.0.0.1:1/", **kwargs}
    with pytest.raises(ValueError, match=names):
        HTTPMetricsUploader(**kwargs)


def test_spool_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(ValueError, match="spool_dir="):
        HTTPMetricsUploader("http://127.0.0.1:1/", spool_dir=not_a_dir)


def test_missing_httpx_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "httpx", None)
    with pytest.raises(ImportError, match=r"pip install 'trainbus\[http\]'"):
        HTTPMetricsUploader("http://127.0.0.1:1/")


def test_importing_the_loggers_does_not_import_httpx() -> None:
    code = "import sys, trainbus.loggers; assert 'httpx' not in sys.modules, 'httpx imported'"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env=env)


# -- bounded requests and prompt cancellation (issue 12.5) ---------------------------------


class RawServer:
    """A TCP server on 127.0.0.1 whose answer to each connection is ``answer(n, conn)``.

    ``sent`` counts the bytes each connection managed to send before the client went away.
    """

    def __init__(self, answer: Callable[[int, Any], None]) -> None:
        import socket

        self._answer = answer
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.bodies: list[bytes] = []
        self.sent: list[int] = []
        self.counted = threading.Event()  # set once a _send_counted answer has ended
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        n = 0
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(n, conn), daemon=True).start()
            n += 1

    def _handle(self, n: int, conn: Any) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            while len(body) < length:
                body += conn.recv(65536)
            self.bodies.append(body)
            try:
                self._answer(n, conn)
            except OSError:  # the client hung up: what the tests want
                pass

    def close(self) -> None:
        self._sock.close()


def _send_counted(server: RawServer, conn: Any, chunks: Iterator[bytes]) -> None:
    sent = 0
    try:
        for chunk in chunks:
            conn.sendall(chunk)
            sent += len(chunk)
    finally:
        server.sent.append(sent)
        server.counted.set()


def _drip(data: bytes) -> Iterator[bytes]:
    """One byte every 50 ms (the 400-odd bytes above: 20 s)."""
    for i in range(len(data)):
        time.sleep(0.05)
        yield data[i:i + 1]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_timeout_bounds_the_whole_request_not_each_read(anyio_backend: str) -> None:
    # A server answering one byte every 50 ms never trips httpx's per-read timeout of 0.3 s;
    # the first attempt must still end at 0.3 s and count as a failed, retried attempt.
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"

    def answer(n: int, conn: Any) -> None:
        if n == 0:
            _send_counted(server, conn, _drip(b"HTTP/1.1 200 OK\r\nX-Pad: " + b"x" * 400))
        else:
            conn.sendall(ok)

    server = RawServer(answer)
    try:
        uploader = HTTPMetricsUploader(server.url, timeout=0.3, close_timeout=5, **FAST)
        with anyio.fail_after(15):
            await make_trainer(2, loggers=[uploader]).fit()
    finally:
        server.close()
    stats = uploader.statistics()
    assert stats.points_sent == 2
    assert stats.retries == 1
    assert stats.last_error is not None
    assert "timeout=0.3" in stats.last_error
    assert await anyio.to_thread.run_sync(server.counted.wait, 10)
    assert server.sent[0] < 400  # cut off long before the slow answer ended


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_huge_response_body_is_not_read_whole(anyio_backend: str) -> None:
    size = 200 * 2**20
    head = f"HTTP/1.1 503 Service Unavailable\r\nContent-Length: {size}\r\n\r\n".encode()
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"

    def answer(n: int, conn: Any) -> None:
        if n == 0:
            block = b"e" * 2**20
            _send_counted(server, conn, itertools.chain([head], itertools.repeat(block, 200)))
        else:
            conn.sendall(ok)

    server = RawServer(answer)
    try:
        uploader = HTTPMetricsUploader(server.url, **FAST)
        with anyio.fail_after(30):
            await make_trainer(2, loggers=[uploader]).fit()
    finally:
        server.close()
    stats = uploader.statistics()
    assert stats.points_sent == 2
    assert stats.retries == 1
    assert stats.last_error is not None
    assert stats.last_error.startswith("HTTP 503 'eeee")
    assert await anyio.to_thread.run_sync(server.counted.wait, 10)
    assert server.sent[0] < 40 * 2**20  # the client hung up after a small prefix


@pytest.mark.anyio
async def test_cancelling_fit_with_everything_spooled_does_not_wait_for_a_dead_server(
    anyio_backend: str, servers: Callable[..., MetricsServer], tmp_path: Path
) -> None:
    down = servers(listen=False)  # every connection refused, for the whole test
    uploader = HTTPMetricsUploader(down.url, batch_size=3, spool_dir=tmp_path,
                                   close_timeout=3600, **FAST)  # waiting it out would hang

    class CancelAt(Callback):
        def __init__(self, scope: anyio.CancelScope) -> None:
            self.scope = scope

        async def batch_end(self, state: Any, logger: Any) -> None:
            if int(state.timer.batch) == 10:
                self.scope.cancel()

    memory = InMemoryLogger()
    with anyio.fail_after(60), pytest.warns(MetricsUploadWarning, match=r"spool_dir"):
        with anyio.CancelScope() as scope:
            await make_trainer(1000, callbacks=[CancelAt(scope)], loggers=[memory, uploader]).fit()
    assert scope.cancelled_caught
    spooled = Counter()
    for path in batch_files(tmp_path):
        for point in json.loads(path.read_bytes())["body"]["points"]:
            spooled[(point["name"], point["step"])] += 1
    assert spooled == logged_points(memory)  # everything logged is safe on disk
    assert sum(spooled.values()) >= 10
    assert uploader.points_sent == 0
