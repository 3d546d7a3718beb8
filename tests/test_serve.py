"""trainbus.serve: the real service under uvicorn on 127.0.0.1, driven with httpx."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import socket
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import httpx
import pytest
import torch
import trio
import uvicorn

from tests.helpers import TinyModel, make_loader
from trainbus import Callback, Trainer, blocking
from trainbus.serve import JobContext, JobManager, create_app, create_server, default_max_running

# Every test here runs under a deadline, so a regression fails instead of hanging.
DEADLINE = 30
#: A raw body's header (httpx sets it by itself for json=...): the service takes JSON only.
JSON = {"Content-Type": "application/json"}


class Recorder(Callback):
    """Counts batches and the close/post_close calls of one job."""

    def __init__(self) -> None:
        self.batches = 0
        self.closed = 0
        self.post_closed = 0

    async def batch_end(self, state: Any, logger: Any) -> None:
        self.batches += 1

    async def close(self, state: Any, logger: Any) -> None:
        self.closed += 1

    async def post_close(self) -> None:
        self.post_closed += 1


class Rendezvous(Callback):
    """At its job's first batch end, waits until ``expected`` jobs have arrived there."""

    def __init__(self, arrivals: list[str], everyone: anyio.Event, expected: int) -> None:
        self.arrivals, self.everyone, self.expected = arrivals, everyone, expected

    async def batch_end(self, state: Any, logger: Any) -> None:
        if int(state.timer.batch) == 1:
            self.arrivals.append(state.run_name)
            if len(self.arrivals) == self.expected:
                self.everyone.set()
            await self.everyone.wait()


class FailAt(Callback):
    def __init__(self, batch: int) -> None:
        self.batch = batch

    async def batch_end(self, state: Any, logger: Any) -> None:
        if int(state.timer.batch) == self.batch:
            raise RuntimeError(f"boom at batch {self.batch}")


class Gate(Callback):
    """Holds training at the end of batch ``at`` until ``gate`` is set."""

    def __init__(self, at: int, gate: anyio.Event) -> None:
        self.at, self.gate = at, gate

    async def batch_end(self, state: Any, logger: Any) -> None:
        if int(state.timer.batch) == self.at:
            await self.gate.wait()


class Factory:
    """A test job factory: TinyModel jobs that record their callbacks' close calls."""

    def __init__(self) -> None:
        self.recorders: dict[str, Recorder] = {}
        self.arrivals: list[str] = []
        self.everyone: anyio.Event | None = None
        self.gate: anyio.Event | None = None

    def __call__(self, ctx: JobContext) -> Trainer:
        p = dict(ctx.params)
        batches = int(p.pop("batches", 4))
        epochs = int(p.pop("epochs", 1))
        rec = self.recorders[ctx.job_id] = Recorder()
        callbacks: list[Callback] = [rec]
        if p.pop("rendezvous", None):
            if self.everyone is None:
                self.everyone = anyio.Event()
            callbacks.append(Rendezvous(self.arrivals, self.everyone, 2))
        if "hold_at" in p:
            self.gate = anyio.Event()
            callbacks.append(Gate(int(p.pop("hold_at")), self.gate))
        if "fail_at" in p:
            callbacks.append(FailAt(int(p.pop("fail_at"))))
        if p:
            raise ValueError(f"unknown parameters {sorted(p)}")
        model = TinyModel()
        return Trainer(
            model,
            make_loader(batches),
            f"{epochs}ep",
            optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
            callbacks=callbacks,
            loggers=ctx.loggers,
            run_name=ctx.job_id,
        )


@asynccontextmanager
async def serving(
    app: Any, sockets: list[socket.socket] | None = None
) -> AsyncIterator[tuple[Any, str]]:
    """Run ``create_server(app)`` as a task on this loop; yield it and its base URL."""
    server = create_server(app, port=0)
    task = asyncio.create_task(server.serve(sockets=sockets))
    ready = asyncio.create_task(server.ready.wait())
    await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        ready.cancel()
        task.result()  # raises why it could not start
    try:
        yield server, f"http://127.0.0.1:{server.port}"
    finally:
        server.should_exit = True
        await task


@asynccontextmanager
async def plain_uvicorn(app: Any) -> AsyncIterator[tuple[uvicorn.Server, str]]:
    """Run any ASGI app under a plain ``uvicorn.Server`` on this loop."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:  # plain uvicorn has no "started" event to wait on
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield server, f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        await task


async def sse_items(response: httpx.Response) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """Parse a text/event-stream body into ``(event, data)`` pairs."""
    name: str | None = None
    data: list[str] = []
    async for line in response.aiter_lines():
        if line == "":
            if name is not None:
                yield name, json.loads("\n".join(data))
            name, data = None, []
        elif line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            data.append(line[len("data: ") :])


async def read_all(
    client: httpx.AsyncClient, job_id: str, query: str = ""
) -> list[tuple[str, dict[str, Any]]]:
    async with client.stream("GET", f"/jobs/{job_id}/events{query}") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return [item async for item in sse_items(response)]


def names(items: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [n for n, _ in items]


def trainbus_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("trainbus-")]


@pytest.mark.asyncio
async def test_job_runs_and_its_event_stream_reaches_the_end(no_leaked_threads: None) -> None:
    factory = Factory()
    with anyio.fail_after(DEADLINE):
        async with serving(create_app(factory)) as (_, url), httpx.AsyncClient(base_url=url) as c:
            r = await c.post("/jobs", json={"epochs": 2, "batches": 3})
            assert r.status_code == 201
            job = r.json()
            assert r.headers["location"] == f"/jobs/{job['id']}"
            assert job["status"] in ("pending", "running")
            items = await read_all(c, job["id"])
            expected = ["init", "fit_start"]
            for _ in range(2):
                expected += ["epoch_start", *["metrics", "batch_end"] * 3, "epoch_end"]
            assert names(items) == [*expected, "fit_end", "end"]
            assert items[-1][1] == {"status": "completed", "error": None, "dropped": 0}
            batch_ends = [d["batch"] for n, d in items if n == "batch_end"]
            assert batch_ends == [1, 2, 3, 4, 5, 6]
            status = (await c.get(f"/jobs/{job['id']}")).json()
            assert status["status"] == "completed"
            assert status["progress"]["batch"] == 6
            assert status["metric_steps"]["loss/train"] == 6
            assert isinstance(status["metrics"]["loss/train"], float)
            rec = factory.recorders[job["id"]]
            assert (rec.batches, rec.closed, rec.post_closed) == (6, 1, 1)
            # A client arriving after the end replays the kept history, then the end.
            assert names(await read_all(c, job["id"], "?since=0")) == [*expected, "fit_end", "end"]
            assert names(await read_all(c, job["id"], "?since=99")) == ["end"]
            listed = (await c.get("/jobs")).json()
            assert [j["id"] for j in listed] == [job["id"]]


@pytest.mark.asyncio
async def test_delete_cancels_a_running_job_and_closes_its_callbacks() -> None:
    factory = Factory()
    with anyio.fail_after(DEADLINE):
        async with serving(create_app(factory)) as (_, url), httpx.AsyncClient(base_url=url) as c:
            job_id = (await c.post("/jobs", json={"batches": 1_000_000})).json()["id"]
            seen: list[str] = []
            async with c.stream("GET", f"/jobs/{job_id}/events") as response:
                async for name, data in sse_items(response):
                    seen.append(name)
                    if name == "batch_end" and seen.count("batch_end") == 1:
                        assert (await c.get(f"/jobs/{job_id}")).json()["status"] == "running"
                        r = await c.delete(f"/jobs/{job_id}")
                        assert r.status_code == 200
                        assert r.json()["status"] == "cancelled"
                    if name == "end":
                        assert data["status"] == "cancelled"
            assert seen[-1] == "end"
            assert "fit_end" not in seen
            rec = factory.recorders[job_id]
            assert rec.closed == 1
            assert rec.post_closed == 1
            assert 1 <= rec.batches < 1_000_000
            assert (await c.get(f"/jobs/{job_id}")).json()["status"] == "cancelled"
            health = (await c.get("/healthz")).json()
            assert (health["status"], health["running"], health["jobs"]) == ("ok", 0, {})


@pytest.mark.asyncio
async def test_two_jobs_train_at_once() -> None:
    # Each job holds its first batch until the other job reached its own first batch:
    # run one after the other, they would never finish (the deadline would fail the test).
    factory = Factory()
    with anyio.fail_after(DEADLINE):
        async with serving(create_app(factory)) as (_, url), httpx.AsyncClient(base_url=url) as c:
            a = (await c.post("/jobs", json={"batches": 5, "rendezvous": True})).json()["id"]
            b = (await c.post("/jobs", json={"batches": 8, "rendezvous": True})).json()["id"]
            results: dict[str, list[tuple[str, dict[str, Any]]]] = {}

            async def follow(job_id: str) -> None:
                results[job_id] = await read_all(c, job_id)

            async with anyio.create_task_group() as tg:
                tg.start_soon(follow, a)
                tg.start_soon(follow, b)
    assert sorted(factory.arrivals) == sorted([a, b])
    assert names(results[a]).count("batch_end") == 5
    assert names(results[b]).count("batch_end") == 8
    assert results[a][-1][1]["status"] == results[b][-1][1]["status"] == "completed"


@pytest.mark.asyncio
async def test_a_client_that_never_reads_does_not_hold_training_up() -> None:
    # Small socket buffers on both ends: the server's writes to the silent client block
    # after a few dozen KiB, so its server-side subscription must drop, not wait.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    listener.bind(("127.0.0.1", 0))
    small_rcv = httpx.AsyncHTTPTransport(
        socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)]
    )
    app = create_app(Factory(), buffer_size=16, stream_history=5000)
    batches = 800  # 1600 items of ~250 bytes; the socket buffers hold about 450
    with anyio.fail_after(DEADLINE):
        async with (
            serving(app, sockets=[listener]) as (_, url),
            httpx.AsyncClient(base_url=url) as c,
            httpx.AsyncClient(base_url=url, transport=small_rcv) as silent_client,
        ):
            job_id = (await c.post("/jobs", json={"batches": batches})).json()["id"]
            async with silent_client.stream("GET", f"/jobs/{job_id}/events?since=0") as silent:
                assert silent.status_code == 200
                # A second client reads everything; the job completes while the silent
                # client's connection stays open and unread.
                reader = await read_all(c, job_id, "?since=0&buffer=10000")
                assert reader[-1] == ("end", {"status": "completed", "error": None, "dropped": 0})
                assert names(reader).count("batch_end") == batches
                status = (await c.get(f"/jobs/{job_id}")).json()
                assert status["status"] == "completed"
                assert status["stream"]["dropped"] > 0  # the silent client lost items
                # Now read the silent client's stream: a gap, then the newest items.
                late = [item async for item in sse_items(silent)]
            gaps = [d["missed"] for n, d in late if n == "gap"]
            assert gaps
            assert sum(gaps) == status["stream"]["dropped"]
            assert late[-2][0] == "fit_end"
            assert late[-1][0] == "end"
            assert late[-1][1]["dropped"] == sum(gaps)


def other_tasks() -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


@pytest.mark.asyncio
async def test_shutdown_with_a_streamed_job_running_cancels_it_and_leaves_nothing() -> None:
    factory = Factory()
    with anyio.fail_after(DEADLINE):
        async with httpx.AsyncClient() as c, serving(create_app(factory)) as (server, url):
            r = await c.post(f"{url}/jobs", json={"batches": 1_000_000})
            job_id = r.json()["id"]
            seen: list[str] = []
            async with c.stream("GET", f"{url}/jobs/{job_id}/events") as response:
                async for name, data in sse_items(response):
                    seen.append(name)
                    if name == "batch_end" and not server.should_exit:
                        server.should_exit = True  # shut down with this client connected
                    if name == "end":
                        assert data["status"] == "cancelled"
            assert seen[-1] == "end"
        # Leaving serving() awaited the server's task: uvicorn has exited.
        rec = factory.recorders[job_id]
        assert (rec.closed, rec.post_closed) == (1, 1)
        assert not trainbus_threads()
        assert not other_tasks()


@pytest.mark.asyncio
async def test_plain_uvicorn_lifespan_exit_cancels_running_jobs() -> None:
    factory = Factory()
    app = create_app(factory)
    with anyio.fail_after(DEADLINE):
        async with plain_uvicorn(app) as (_, url):
            async with httpx.AsyncClient(base_url=url) as c:
                job_id = (await c.post("/jobs", json={"batches": 1_000_000})).json()["id"]
            job = app.state.jobs.get(job_id)
            async for item in job.stream.subscribe(since=0):
                if item.sse_event == "batch_end":
                    break
            # No client is connected: leaving plain_uvicorn() runs the lifespan shutdown.
    assert job.status == "cancelled"
    assert factory.recorders[job_id].closed == 1
    assert not trainbus_threads()
    assert not other_tasks()


@pytest.mark.asyncio
async def test_bad_requests_get_errors_that_name_the_fix() -> None:
    with anyio.fail_after(DEADLINE):
        async with (
            serving(create_app(Factory(), max_running=1)) as (_, url),
            httpx.AsyncClient(base_url=url) as c,
        ):
            r = await c.get("/jobs/nope")
            assert r.status_code == 404
            assert "GET /jobs" in r.json()["error"]
            assert (await c.delete("/jobs/nope")).status_code == 404
            assert (await c.get("/jobs/nope/events")).status_code == 404
            r = await c.post("/jobs", json={"batchez": 3})
            assert r.status_code == 400
            assert "batchez" in r.json()["error"]
            r = await c.post("/jobs", content=b"{not json", headers=JSON)
            assert r.status_code == 400
            assert "JSON" in r.json()["error"]
            r = await c.post("/jobs", json=[1, 2])
            assert r.status_code == 400
            running = (await c.post("/jobs", json={"batches": 1_000_000})).json()["id"]
            r = await c.post("/jobs", json={"batchez": 3})  # at the limit: still what is wrong
            assert r.status_code == 400
            assert "batchez" in r.json()["error"]
            r = await c.post("/jobs", json={})
            assert r.status_code == 429
            assert "max_running=1" in r.json()["error"]
            r = await c.get(f"/jobs/{running}/events?since=-1")
            assert r.status_code == 400
            r = await c.get(f"/jobs/{running}/events?buffer=0")
            assert r.status_code == 400
            assert "buffer='0'" in r.json()["error"]
            assert (await c.delete(f"/jobs/{running}")).json()["status"] == "cancelled"


BAD_BODIES: list[tuple[bytes, str]] = [
    (b"[" * 100_000 + b"]" * 100_000, "nested"),  # RecursionError inside json.loads
    (b'{"a": ' + b"[" * 5_000 + b"]" * 5_000 + b"}", "nested"),
    (b'{"epochs": ' + b"[" * 60 + b"]" * 60 + b"}", "nested"),  # parses; too deep to keep
    (b'{"lr": NaN}', "NaN"),
    (b'{"lr": Infinity}', "Infinity"),
    (b'{"\\ud800": 1}', "surrogate"),
    (b"\xff\xfe{}", "UTF-8"),
    (b'{"epochs": ' + b"9" * 10_000 + b"}", "JSON"),
    (b"null", "object"),
    (b'"jobs"', "object"),
    (b"[1, 2]", "object"),
    (b"{not json", "JSON"),
]


@pytest.mark.asyncio
async def test_bad_bodies_of_any_shape_get_400_with_a_message() -> None:
    # Issue 12.9: a deeply nested body answered 500 (RecursionError in the log).
    with anyio.fail_after(DEADLINE):
        async with serving(create_app(Factory())) as (_, url), httpx.AsyncClient(base_url=url) as c:
            for body, word in BAD_BODIES:
                r = await c.post("/jobs", content=body, headers=JSON)
                assert r.status_code == 400, (body[:40], r.text[:200])
                message = r.json()["error"]
                assert word in message, (body[:40], message)
                assert len(message) < 400  # a message, not the body echoed back
            assert (await c.get("/healthz")).json()["running"] == 0


@pytest.mark.asyncio
async def test_a_body_over_the_limit_is_refused_with_413() -> None:
    # Issue 12.9: a 200 MB body was read whole (8.4 s, 1.2 GB RSS).
    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked
        for _ in range(64):
            yield b" " * 1024

    with anyio.fail_after(DEADLINE):
        async with (
            serving(create_app(Factory(), max_body_bytes=16_384)) as (_, url),
            httpx.AsyncClient(base_url=url) as c,
        ):
            r = await c.post("/jobs", content=b" " * 20_000, headers=JSON)
            assert r.status_code == 413
            assert "max_body_bytes=16384" in r.json()["error"]
            r = await c.post("/jobs", content=chunks(), headers=JSON)
            assert r.status_code == 413
            r = await c.post("/jobs", content=b'{"batches": 2}' + b" " * 16_000, headers=JSON)
            assert r.status_code == 201
    assert create_app(Factory()).state.max_body_bytes == 1 << 20  # the default: 1 MiB
    with pytest.raises(ValueError, match="max_body_bytes"):
        create_app(Factory(), max_body_bytes=0)


def test_default_max_running_fits_the_machine() -> None:
    # Issue 12.9: max_running=None by default let 20 POSTs start 20 training threads.
    cores = default_max_running()
    assert cores == (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    assert JobManager(Factory()).max_running == cores
    assert create_app(Factory()).state.jobs.max_running == cores
    assert JobManager(Factory(), max_running=None).max_running is None  # explicit: no limit


@pytest.mark.asyncio
async def test_jobs_beyond_the_default_limit_get_429_with_retry_after() -> None:
    cores = default_max_running()
    with anyio.fail_after(DEADLINE):
        async with serving(create_app(Factory())) as (_, url), httpx.AsyncClient(base_url=url) as c:
            started = [
                (await c.post("/jobs", json={"batches": 1_000_000})).json()["id"]
                for _ in range(cores)
            ]
            r = await c.post("/jobs", json={"batches": 1_000_000})
            assert r.status_code == 429
            assert r.headers["retry-after"] == "1"
            assert f"max_running={cores}" in r.json()["error"]
            for job_id in started:
                assert (await c.delete(f"/jobs/{job_id}")).json()["status"] == "cancelled"
            assert (await c.post("/jobs", json={"batches": 1})).status_code == 201


@pytest.mark.asyncio
async def test_quickstart_replays_a_finished_job() -> None:
    # Issue 13: docs/service.md's quickstart, on the demo job: a client that connects after
    # the job finished gets its history (events and metrics), not only `end`.
    with anyio.fail_after(DEADLINE):
        async with serving(create_app()) as (_, url), httpx.AsyncClient(base_url=url) as c:
            job_id = (await c.post("/jobs", json={"epochs": 2, "batches": 20})).json()["id"]
            while (await c.get(f"/jobs/{job_id}")).json()["status"] != "completed":
                await read_all(c, job_id, "?since=999999")  # returns at the job's end
            items = await read_all(c, job_id, "?since=0")
    got = names(items)
    assert got[:2] == ["init", "fit_start"]
    assert got.count("batch_end") == 40
    assert got.count("metrics") >= 40
    assert got[-2:] == ["fit_end", "end"]
    seqs = [d["seq"] for _, d in items[:-1]]
    assert seqs[0] == 0
    assert seqs == sorted(set(seqs))  # in order, no repeats (bus snapshots are left out)


@pytest.mark.asyncio
async def test_failed_job_reports_its_error() -> None:
    with anyio.fail_after(DEADLINE):
        async with (
            serving(create_app(Factory())) as (_, url),
            httpx.AsyncClient(base_url=url) as c,
        ):
            job_id = (await c.post("/jobs", json={"batches": 5, "fail_at": 2})).json()["id"]
            items = await read_all(c, job_id)
            end = items[-1][1]
            assert end["status"] == "failed"
            assert end["error"] == "RuntimeError: boom at batch 2"
            assert (await c.get(f"/jobs/{job_id}")).json()["status"] == "failed"
            assert (await c.get("/healthz")).status_code == 200


@pytest.mark.asyncio
async def test_factory_that_forgets_the_loggers_is_a_server_error() -> None:
    def forgetful(ctx: JobContext) -> Trainer:
        model = TinyModel()
        return Trainer(model, make_loader(2), "1ep")

    with anyio.fail_after(DEADLINE):
        async with (
            serving(create_app(forgetful)) as (_, url),
            httpx.AsyncClient(base_url=url) as c,
        ):
            r = await c.post("/jobs", json={})
            assert r.status_code == 500
            assert "loggers=[*ctx.loggers" in r.json()["error"]


@pytest.mark.asyncio
async def test_last_event_id_resumes_after_that_item() -> None:
    factory = Factory()
    with anyio.fail_after(DEADLINE):
        async with (
            serving(create_app(factory)) as (_, url),
            httpx.AsyncClient(base_url=url) as c,
        ):
            # The job holds at batch 3 until the test lets it go.
            job_id = (await c.post("/jobs", json={"batches": 5, "hold_at": 3})).json()["id"]
            first: list[tuple[str, dict[str, Any]]] = []
            async with c.stream("GET", f"/jobs/{job_id}/events") as response:
                events = sse_items(response)
                async for name, data in events:
                    first.append((name, data))
                    if name == "batch_end" and data["batch"] == 3:
                        break
                last_seen = first[4][1]["seq"]
                resumed: list[tuple[str, dict[str, Any]]] = []
                headers = {"Last-Event-ID": str(last_seen)}
                async with c.stream("GET", f"/jobs/{job_id}/events", headers=headers) as again:
                    async for name, data in sse_items(again):
                        resumed.append((name, data))
                        if name == "batch_end" and data["batch"] == 3:
                            assert factory.gate is not None
                            factory.gate.set()
                    rest = [item async for item in events]
    full = first + rest
    assert resumed == full[5:]
    assert resumed[0][1]["seq"] == last_seen + 1
    assert full[-1][1]["status"] == "completed"


@pytest.mark.anyio
async def test_job_manager_without_http(anyio_backend: str) -> None:
    """The manager is plain anyio: it runs under trio as well as asyncio."""
    factory = Factory()
    with anyio.fail_after(DEADLINE):
        async with JobManager(factory) as jobs:
            job = await jobs.start({"batches": 3})
            seen = [item.sse_event async for item in job.stream.subscribe(since=0)]
            assert await job.wait() == "completed"
            long = await jobs.start({"batches": 1_000_000})
            async for item in long.stream.subscribe(since=0):
                if item.sse_event == "batch_end":
                    break
        # Leaving the manager cancelled the long job and closed its callbacks.
    assert seen[-1] == "fit_end"
    assert long.status == "cancelled"
    assert factory.recorders[long.id].closed == 1
    assert not trainbus_threads()


class FailBlockingAtFitStart(Callback):
    @blocking
    def fit_start(self, state: Any, logger: Any) -> None:
        raise RuntimeError("blocking handler failed")


class AsyncFitStart(Callback):
    """An async handler for FIT_START and no earlier event (its lane is idle then)."""

    async def fit_start(self, state: Any, logger: Any) -> None:
        pass


def in_probe_thread(main: Any, timeout: float = 5.0) -> tuple[bool, list[Any]]:
    """Run ``anyio.run(main)`` in a daemon thread; return (finished in time, what it returned).

    For scenarios that hang when a bug is present: a hang inside ``close`` is shielded, so
    no deadline ends it, and only this thread is left behind instead of the test run.
    """
    outcome: list[Any] = []

    def scenario() -> None:
        try:
            outcome.append(anyio.run(main))
        except BaseException as exc:  # reported through `outcome`
            outcome.append(repr(exc))

    probe = threading.Thread(target=scenario, name="hang-probe", daemon=True)
    probe.start()
    probe.join(timeout=timeout)
    return not probe.is_alive(), outcome


def test_job_whose_blocking_handler_fails_at_fit_start_is_failed() -> None:
    # Regression: a loop lane marked busy in a burst that Stopped unwound was never woken,
    # so close waited for it forever (fixed in EventBus.publish).
    async def main() -> str:
        def factory(ctx: JobContext) -> Trainer:
            return Trainer(
                TinyModel(),
                make_loader(3),
                "1ep",
                callbacks=[FailBlockingAtFitStart(), AsyncFitStart()],
                loggers=ctx.loggers,
            )

        async with JobManager(factory) as jobs:
            job = await jobs.start({})
            return str(await job.wait())

    finished, outcome = in_probe_thread(main)
    assert finished, "the job never finished: close hangs"
    assert outcome == ["failed"]


def test_job_cancelled_right_after_start_closes_and_is_cancelled() -> None:
    factory = Factory()

    async def main() -> tuple[str, int]:
        async with JobManager(factory) as jobs:
            job = await jobs.start({"batches": 1_000_000})
            job.cancel()  # before its task has run: fit() starts already cancelled
            status = await job.wait()
            return str(status), factory.recorders[job.id].closed

    finished, outcome = in_probe_thread(main)
    assert finished, "the cancelled job never finished: fit() hangs"
    assert outcome == [("cancelled", 1)]


def test_module_entry_point_parses_arguments() -> None:
    from trainbus.serve.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0


# -- docs/service.md and examples/service/ ---------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "service"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_service_{name}", EXAMPLES / name)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_show_the_examples_verbatim() -> None:
    doc = (ROOT / "docs" / "service.md").read_text()
    for name in ("starlette_embed.py", "trio_embed.py"):
        assert (EXAMPLES / name).read_text().strip() in doc, f"docs/service.md: {name} drifted"
    app = (EXAMPLES / "app.py").read_text()
    factory = app[app.index("def regression_job") : app.index("if __name__")].strip()
    assert factory in doc


@pytest.mark.asyncio
async def test_starlette_example_trains_streams_and_cancels() -> None:
    example = load_example("starlette_embed.py")
    with anyio.fail_after(DEADLINE):
        async with (
            plain_uvicorn(example.app) as (_, url),
            httpx.AsyncClient(base_url=url) as c,
        ):
            assert (await c.post("/train")).status_code == 201
            assert (await c.post("/train")).status_code == 409
            async with c.stream("GET", "/train/events") as response:
                items = [item async for item in sse_items(response)]
            assert names(items).count("batch_end") == 2 * example.BATCHES
            assert names(items)[-2:] == ["fit_end", "end"]
            assert items[-1][1] == {"status": "completed"}
            # A second run, cancelled from a request while it trains.
            assert (await c.post("/train")).status_code == 201
            async with c.stream("GET", "/train/events") as response:
                seen = []
                async for name, data in sse_items(response):
                    seen.append(name)
                    if name == "batch_end" and seen.count("batch_end") == 1:
                        r = await c.delete("/train")
                        assert r.json() == {"status": "cancelled"}
                    if name == "end":
                        assert data == {"status": "cancelled"}
            assert "fit_end" not in seen
    assert not trainbus_threads()


def test_trio_example_stops_the_run_from_a_subscriber(capsys: pytest.CaptureFixture[str]) -> None:
    example = load_example("trio_embed.py")
    # A target every loss meets: the watcher cancels fit() at the first logged loss.
    assert trio.run(example.main, 5, 100.0).startswith("stopped at batch 1, loss ")
    capsys.readouterr()
    # A target no loss meets: the run finishes and both subscriptions end with it.
    assert trio.run(example.main, 2, -1.0) == "finished"
    out = capsys.readouterr().out.splitlines()
    assert out.count("epoch_end: epoch 20") == 1
    assert out[-2:] == ["fit_end: epoch 20", "finished"]
    assert not trainbus_threads()


@pytest.mark.asyncio
async def test_service_example_app_runs_its_own_job() -> None:
    example = load_example("app.py")
    with anyio.fail_after(DEADLINE):
        async with serving(example.app) as (_, url), httpx.AsyncClient(base_url=url) as c:
            r = await c.post("/jobs", json={"epochs": 1, "batches": 4, "width": 8})
            assert r.status_code == 201
            items = await read_all(c, r.json()["id"])
            assert names(items).count("batch_end") == 4
            assert items[-1][1]["status"] == "completed"
            r = await c.post("/jobs", json={"epochs": 0})
            assert r.status_code == 400
            assert "out of range" in r.json()["error"]


# -- the module itself -------------------------------------------------------------------------


def test_serve_all_lists_its_public_names_with_docstrings() -> None:
    import inspect

    import trainbus.serve as serve

    public = {
        name
        for name, value in vars(serve).items()
        if not name.startswith("_") and not isinstance(value, ModuleType) and name != "annotations"
    }
    assert sorted(public) == sorted(serve.__all__)
    for name in serve.__all__:
        obj = getattr(serve, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert (obj.__doc__ or "").strip(), f"trainbus.serve.{name} has no docstring"


def test_missing_service_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    loaded = [m for m in sys.modules if m.split(".")[:2] == ["trainbus", "serve"]]
    for name in loaded:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "starlette", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"pip install 'trainbus\[service\]'"):
        importlib.import_module("trainbus.serve")


@pytest.mark.asyncio
async def test_metrics_and_health_of_each_job() -> None:
    # Issue 57: /metrics carries every job's series (a job_id label each); a job held in a
    # handler past its deadline is stalled on /jobs/{id}/healthz and on the service's /healthz.
    from prometheus_client.parser import text_string_to_metric_families

    factory = Factory()
    app = create_app(factory)
    with anyio.fail_after(DEADLINE):
        async with serving(app) as (_, url), httpx.AsyncClient(base_url=url) as c:
            done = (await c.post("/jobs", json={"batches": 3})).json()["id"]
            while (await c.get(f"/jobs/{done}")).json()["status"] != "completed":
                await read_all(c, done, "?since=999999")
            held = (await c.post("/jobs", json={"batches": 6, "hold_at": 3})).json()["id"]
            job = app.state.jobs.get(held)
            assert job.watch is not None
            job.watch.stall_floor = 0.2  # the hold is a stall after 0.2 s
            while (reply := await c.get(f"/jobs/{held}/healthz")).json()["status"] != "stalled":
                await anyio.sleep(0.02)
            assert reply.status_code == 503
            service = await c.get("/healthz")
            assert (service.status_code, service.json()["stalled"]) == (503, [held])
            text = (await c.get("/metrics")).text
            assert factory.gate is not None
            factory.gate.set()
            await job.wait()
            assert (await c.get(f"/jobs/{held}/healthz")).json()["status"] == "ended"
            assert (await c.get("/healthz")).status_code == 200
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for f in text_string_to_metric_families(text) for s in f.samples}  # fmt: skip
    assert values[("trainbus_batches_total", (("job_id", done),))] == 3
    assert values[("trainbus_healthy", (("job_id", held),))] == 0
    assert values[("trainbus_jobs", (("status", "completed"),))] == 1
