"""Scenario (g)'s callbacks (``bench_trailing.py``): the ``@blocking`` weight reader that
also samples the training thread's clocks, the plain reader on its own thread, and the
upload (httpx, tuned httpx, a hand-written client or a bare sleep), lockstep or trailing."""

from __future__ import annotations

import json
import math
import threading
import time
from typing import Any

import anyio
import httpx
import torch
from thread_clock import sample
from upload_server import RawClient

import trainbus

__all__ = ["LATENCY_MS", "ThreadReader", "TrailingUpload", "TruthReader", "Upload", "checksum"]

LATENCY_MS = 5.0


def checksum(model: torch.nn.Module) -> float:
    return float(model[0].weight.detach().sum())


class TruthReader(trainbus.Callback):
    """``@blocking``: on the training thread, the weights right after this batch's step.

    Also samples the training thread's clocks at ``FIT_START`` and ``FIT_END``."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}
        self.start: dict[str, float] = {}
        self.end: dict[str, float] = {}
        self.torch_threads = 0
        self.ident = 0
        self.engine: Any = None

    def _sample(self) -> dict[str, float]:
        stats = self.engine.statistics()
        return {**sample(), "waits": stats.barrier_waits,
                "waited": stats.barrier_wait_time + stats.backpressure_wait_time}

    @trainbus.blocking
    def fit_start(self, state: Any, logger: Any) -> None:
        self.torch_threads = torch.get_num_threads()
        self.ident = threading.get_ident()
        self.start = self._sample()

    @trainbus.blocking
    def batch_end(self, state: Any, logger: Any) -> None:
        self.seen[int(state.timer.batch)] = checksum(state.model)

    @trainbus.blocking
    def fit_end(self, state: Any, logger: Any) -> None:
        self.end = self._sample()


class ThreadReader(trainbus.Callback):
    """A plain handler on its own thread: lockstep only while the barrier waits for it."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}
        self.first = self.last = math.nan
        self.idents: set[int] = set()

    def batch_end(self, state: Any, logger: Any) -> None:
        self.seen[int(state.timer.batch)] = checksum(state.model)
        self.idents.add(threading.get_ident())
        self.last = time.thread_time()
        if math.isnan(self.first):
            self.first = self.last


class Upload(trainbus.Callback):
    """Awaits one POST per batch (the README's handler) on one kept-alive connection.

    ``client``: ``"httpx"`` (``httpx.AsyncClient``, ``client.post(url, json=...)``),
    ``"tuned"`` (the same client with ``trust_env=False``, and a new ``httpx.Request`` per
    POST from a pre-parsed URL, fixed headers and the client's timeout, sent with
    ``client.send``: see ``bench_http_client.py``), ``"raw"`` (:class:`RawClient`) or
    ``"sleep"`` (builds the payload, then ``await anyio.sleep(5 ms)``: the same wait,
    no client at all)."""

    def __init__(self, url: str, client: str = "httpx") -> None:
        self.url = url
        self.client = client
        self.httpx = (httpx.AsyncClient(trust_env=client != "tuned")
                      if client in ("httpx", "tuned") else None)
        self.raw = RawClient(url) if client == "raw" else None
        self.target = httpx.URL(url)
        self.headers = {"Content-Type": "application/json"}
        self.extensions = {"timeout": httpx.Timeout(5.0).as_dict()}
        self.sent = 0

    async def batch_end(self, state: Any, logger: Any) -> None:
        await self.send(int(state.timer.batch))

    async def send(self, batch: int) -> None:
        """One POST of ``batch``'s payload with the chosen client (or the bare wait)."""
        payload = {"batch": batch}
        if self.client == "tuned":
            assert self.httpx is not None
            request = httpx.Request("POST", self.target, content=json.dumps(payload).encode(),
                                    headers=self.headers, extensions=self.extensions)
            (await self.httpx.send(request)).raise_for_status()
        elif self.httpx is not None:
            (await self.httpx.post(self.url, json=payload)).raise_for_status()
        elif self.raw is not None:
            await self.raw.post(json.dumps(payload).encode())
        else:
            json.dumps(payload).encode()
            await anyio.sleep(LATENCY_MS / 1e3)
        self.sent += 1

    async def close(self, state: Any, logger: Any) -> None:
        if self.httpx is not None:
            await self.httpx.aclose()
        if self.raw is not None:
            await self.raw.aclose()


class TrailingUpload(Upload):
    @trainbus.trailing(2)
    async def batch_end(self, state: Any, logger: Any) -> None:
        await super().batch_end(state, logger)
