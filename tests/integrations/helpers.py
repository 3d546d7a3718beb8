"""What the integration tests share: a slow metrics service on 127.0.0.1, the callbacks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

import trainbus

#: The service answers each POST after this long; a batch takes BATCH_SLEEP + compute,
#: so the upload run inline costs every batch about UPLOAD_LATENCY more (about 1.5x).
UPLOAD_LATENCY = 0.02
BATCH_SLEEP = 0.04
BATCHES = 16


class MetricsService:
    """A real HTTP server on 127.0.0.1 (port 0) that answers each POST after ``latency``."""

    def __init__(self, latency: float = UPLOAD_LATENCY) -> None:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                time.sleep(service.latency)
                with service.lock:
                    service.posts += 1
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.latency = latency
        self.lock = threading.Lock()
        self.posts = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> MetricsService:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@contextmanager
def metrics_service(latency: float = UPLOAD_LATENCY) -> Iterator[MetricsService]:
    with MetricsService(latency) as service:
        yield service


class Upload(trainbus.Callback):
    """Awaits a real POST at every ``BATCH_END``; may trail training by 2 batches."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sent: list[int] = []
        self.client = httpx.AsyncClient()  # binds to the loop on first use

    @trainbus.trailing(2)
    async def batch_end(self, state: trainbus.State, logger: trainbus.Logger) -> None:
        response = await self.client.post(self.url, json={"batch": int(state.timer.batch)})
        response.raise_for_status()
        self.sent.append(int(state.timer.batch))

    async def close(self, state: trainbus.State, logger: trainbus.Logger) -> None:
        await self.client.aclose()


#: How long a training step waits for the previous batch's trailing upload to finish
#: (``TrailingUpload.step``): with the upload handed over when its batch ended it takes one
#: upload's latency; without, nothing runs it until the training thread waits.
HANDOFF_PATIENCE = 5.0


class TrailingUpload(trainbus.Callback):
    """An ``@trailing(2) async def batch_end`` awaiting a real POST (a new user's upload).

    The host's training step calls :meth:`step` with its batch index: batch ``k`` waits
    until batch ``k - 1``'s upload is done, which holds only if the bus handed that call
    over when batch ``k - 1`` ended (whatever events the host publishes), not at a later
    wait of the training thread. So the barriers never wait, by construction: a test
    synchronised on the bus's structure, not on the machine's speed.
    """

    def __init__(self, url: str, batches: int) -> None:
        self.url = url
        self.finished = [threading.Event() for _ in range(batches + 1)]
        self.handed_over: list[bool] = []  # per batch from the second: found done in time
        self.client = httpx.AsyncClient()

    @trainbus.trailing(2)
    async def batch_end(self, state: trainbus.State, logger: trainbus.Logger) -> None:
        response = await self.client.post(self.url, json={"batch": int(state.timer.batch)})
        response.raise_for_status()
        self.finished[int(state.timer.batch)].set()  # batch k - 1 ends with count k

    async def close(self, state: trainbus.State, logger: trainbus.Logger) -> None:
        await self.client.aclose()

    def step(self, batch_index: int) -> None:
        """In batch ``batch_index``'s step: wait for the previous batch's upload (once one
        was not done in time, no more waits: the test has failed)."""
        if batch_index and all(self.handed_over):
            self.handed_over.append(self.finished[batch_index].wait(HANDOFF_PATIENCE))


class InlineUpload:
    """The same upload, run inline on the host's training thread (what the bus saves)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = httpx.Client()
        self.sent = 0

    def __call__(self, batch: int) -> None:
        self.client.post(self.url, json={"batch": batch}).raise_for_status()
        self.sent += 1

    def close(self) -> None:
        self.client.close()


class GradientsAtEvent(trainbus.Callback):
    """A ``@blocking`` handler that records whether every parameter has a gradient."""

    def __init__(self, event: str = "after_train_batch") -> None:
        self.event = event
        self.seen: list[tuple[int, bool]] = []

    @trainbus.blocking
    def after_train_batch(self, state: trainbus.State, logger: trainbus.Logger) -> None:
        params = list(state.model.parameters())
        self.seen.append(
            (int(state.timer.batch), bool(params) and all(p.grad is not None for p in params))
        )


class EventLog(trainbus.Callback):
    """Every event with the batch count its handler saw (an overridden ``run_event``)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def run_event(self, event: trainbus.Event, state: trainbus.State, logger: Any) -> None:
        self.events.append((event.value, int(state.timer.batch)))


def ratio(with_bus: float, without: float) -> float:
    return with_bus / without
