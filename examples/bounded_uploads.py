"""A 20 ms upload per 5 ms batch: three ways, measured side by side.

Run it:  python examples/bounded_uploads.py [--batches 200] [--latency-ms 20] [--batch-ms 5]

One callback's handlers run one at a time, in order (D1). An ``await client.post(...)``
of 20 ms in ``batch_end`` therefore handles at most 50 batches a second however far it
may trail (``@trainbus.trailing``): with 5 ms batches its queue fills and training goes
at the upload's pace. Two designs keep up:

- ``logged``: log the values (``logger.log_metrics``; the trainer already logs the loss)
  and let :class:`~trainbus.loggers.HTTPMetricsUploader` send them in batches of points
  from its own background task: one request per ``batch_size`` points.
- ``bounded``: :class:`BoundedUploads` sends every batch's payload from a task group it
  owns, with at most ``max_in_flight`` requests at once: 20 ms / 5 ms needs 4 in flight,
  it allows 8. When 8 are in flight ``batch_end`` waits for one to finish, and training
  waits for ``batch_end`` only ``trailing`` batches later: memory and requests stay
  bounded, nothing is dropped. ``close`` waits for the last requests.

The batch is a 5 ms ``time.sleep`` in ``forward`` standing in for the GPU (the training
thread is busy, the interpreter is free), so the figures are the bus's, not the CPU's.
Each variant prints ms per batch next to the loop without uploads.
"""

from __future__ import annotations

import argparse
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import anyio
import httpx
import torch

import trainbus
from trainbus.loggers import HTTPMetricsUploader


class BoundedUploads(trainbus.Callback):
    """POSTs each batch's loss from a task group it owns, ``max_in_flight`` at most.

    Use it as an async context manager around ``fit()``: the task group lives as long as
    the ``async with`` block, so no request outlives it, and a failed request cancels
    the block (and so ``fit()``) with the request's exception.

    Args:
        url: Where to POST.
        max_in_flight: Requests at once at most; ``batch_end`` waits for a free one.
    """

    trailing = 2  # its handlers read only their event's snapshot

    def __init__(self, url: str, max_in_flight: int = 8) -> None:
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int):
            raise ValueError(f"max_in_flight={max_in_flight!r} must be an int >= 1, e.g. 8")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight={max_in_flight!r} must be an int >= 1, e.g. 8")
        self.url = url
        self.max_in_flight = max_in_flight
        self.sent = 0
        self.peak_in_flight = 0
        self._in_flight = 0
        self._slots: anyio.Semaphore | None = None
        self._client: httpx.AsyncClient | None = None
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> BoundedUploads:
        self._slots = anyio.Semaphore(self.max_in_flight)
        self._client = httpx.AsyncClient()
        await self._client.__aenter__()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._tg is not None
        assert self._client is not None
        try:
            return await self._tg.__aexit__(exc_type, exc, tb)  # waits for every request
        finally:
            self._tg = None
            await self._client.__aexit__(None, None, None)

    async def _post(self, payload: dict[str, Any]) -> None:
        assert self._client is not None
        assert self._slots is not None
        try:
            response = await self._client.post(self.url, json=payload)
            response.raise_for_status()
            self.sent += 1
        finally:
            self._in_flight -= 1
            self._slots.release()

    async def batch_end(self, state: Any, logger: Any) -> None:
        """Start this batch's request once fewer than ``max_in_flight`` are in flight."""
        if self._tg is None or self._slots is None:
            raise RuntimeError("use `async with BoundedUploads(url) as uploads:` around fit()")
        payload = {"batch": int(state.timer.batch), "loss": float(state.loss)}
        await self._slots.acquire()
        self._in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self._in_flight)
        self._tg.start_soon(self._post, payload)

    async def close(self, state: Any, logger: Any) -> None:
        """Wait until every request started so far has finished."""
        if self._slots is None:
            return
        for _ in range(self.max_in_flight):  # all slots free: nothing in flight
            await self._slots.acquire()
        for _ in range(self.max_in_flight):
            self._slots.release()


class AwaitEach(trainbus.Callback):
    """The straightforward handler: awaits each batch's POST (one at a time, D1)."""

    trailing = 2

    def __init__(self, client: httpx.AsyncClient, url: str) -> None:
        self.client = client
        self.url = url
        self.sent = 0

    async def batch_end(self, state: Any, logger: Any) -> None:
        """POST this batch's loss and wait for the answer."""
        response = await self.client.post(self.url, json={"loss": float(state.loss)})
        response.raise_for_status()
        self.sent += 1


class _Service(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            self.server.open += 1
            self.server.peak = max(self.server.peak, self.server.open)
        time.sleep(self.server.latency_s)
        with self.server.lock:
            self.server.open -= 1
            self.server.answered += 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, latency_ms: float) -> None:
        super().__init__(("127.0.0.1", 0), _Service)
        self.latency_s = latency_ms / 1000
        self.lock = threading.Lock()
        self.open = self.peak = self.answered = 0


class Service:
    """A local metrics service answering every POST after ``latency_ms`` (port 0).

    ``peak`` is the most requests it was answering at once, ``answered`` how many it
    answered.
    """

    def __init__(self, latency_ms: float) -> None:
        self.server = _Server(latency_ms)
        self.url = f"http://127.0.0.1:{self.server.server_port}/points"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def peak(self) -> int:
        return self.server.peak

    def __enter__(self) -> Service:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


class Busy(torch.nn.Module):
    """A linear model whose forward pass takes ``batch_ms`` (a stand-in for GPU work)."""

    def __init__(self, batch_ms: float) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 2)
        self.delay = batch_ms / 1000

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay)
        out: torch.Tensor = self.lin(x)
        return out


def make_trainer(batches: int, batch_ms: float, **kw: Any) -> trainbus.Trainer:
    x = torch.randn(batches * 16, 8)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, (x.sum(1) > 0).long()), batch_size=16
    )
    model = Busy(batch_ms)
    return trainbus.Trainer(
        model,
        loader,
        "1ep",
        loss_fn=torch.nn.functional.cross_entropy,
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        device="cpu",
        warn_slow_callbacks=False,
        **kw,
    )


async def timed(trainer: trainbus.Trainer, batches: int) -> float:
    started = time.perf_counter()
    await trainer.fit()
    return (time.perf_counter() - started) * 1000 / batches


async def main(
    batches: int = 200, latency_ms: float = 20.0, batch_ms: float = 5.0
) -> dict[str, float]:
    """Run the loop without uploads, then each variant; print and return ms per batch."""
    torch.set_num_threads(1)  # a tiny model: more threads only add hand-offs
    results: dict[str, float] = {}
    with Service(latency_ms) as service:
        await make_trainer(10, batch_ms).fit()  # warm-up: first-use costs of torch and threads
        results["no uploads"] = await timed(make_trainer(batches, batch_ms), batches)

        async with httpx.AsyncClient() as client:
            each = AwaitEach(client, service.url)
            results["await each POST, trailing(2)"] = await timed(
                make_trainer(batches, batch_ms, callbacks=[each]), batches
            )
            assert each.sent == batches

        uploader = HTTPMetricsUploader(service.url, batch_size=50, flush_seconds=0.5)
        results["logged, HTTPMetricsUploader batches"] = await timed(
            make_trainer(batches, batch_ms, loggers=[uploader]), batches
        )
        assert uploader.statistics().points_sent == batches  # loss/train, one per batch

        service.server.peak = 0
        async with BoundedUploads(service.url, max_in_flight=8) as bounded:
            results["task group, 8 in flight"] = await timed(
                make_trainer(batches, batch_ms, callbacks=[bounded]), batches
            )
        assert bounded.sent == batches
        assert service.peak <= 8, service.peak
    print(f"{batches} batches of {batch_ms:g} ms, one {latency_ms:g} ms POST per batch:")
    for name, ms in results.items():
        print(f"  {name:<38} {ms:6.2f} ms/batch")
    print(f"  (task group: at most {service.peak} requests at the service at once)")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--batch-ms", type=float, default=5.0)
    args = parser.parse_args()
    anyio.run(main, args.batches, args.latency_ms, args.batch_ms)
