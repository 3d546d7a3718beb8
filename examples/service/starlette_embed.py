"""Embed trainbus in a Starlette app by hand: a lifespan task group, SSE, cancellation.

Run it:  uvicorn examples.service.starlette_embed:app --port 8000
Then:    curl -X POST localhost:8000/train        (starts a run; 409 if one is running)
         curl -N localhost:8000/train/events      (server-sent events until the run ends)
         curl -X DELETE localhost:8000/train      (cancels the run; callbacks still close)

FastAPI is Starlette underneath: pass the same ``lifespan`` to ``FastAPI(lifespan=...)``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import torch
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import trainbus
from trainbus.callbacks import EventStream

BATCHES = 50


def build_trainer(stream: EventStream) -> trainbus.Trainer:
    """A small MLP on random data; the stream goes in ``loggers`` to see metrics too."""
    x, y = torch.randn(BATCHES * 16, 8), torch.randint(0, 2, (BATCHES * 16,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    return trainbus.Trainer(
        model, loader, "2ep", loss_fn=torch.nn.functional.cross_entropy, loggers=[stream]
    )


class Run:
    """The one training run this app holds: its stream and its cancel scope."""

    def __init__(self) -> None:
        self.stream = EventStream(history=1024)  # late clients replay what they missed
        self.scope = anyio.CancelScope()
        self.done = anyio.Event()
        self.status = "running"

    async def train(self) -> None:
        try:
            with self.scope:  # DELETE cancels it; fit() still closes every callback
                await build_trainer(self.stream).fit()
                self.status = "completed"
        finally:
            if self.status == "running":
                self.status = "cancelled"
            self.done.set()


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    # The task group outlives every request: training runs in it, on the server's loop.
    async with anyio.create_task_group() as tg:
        app.state.tg, app.state.run = tg, None
        yield
        tg.cancel_scope.cancel()  # shutting down: cancel what still trains


async def start(request: Request) -> Response:
    run: Run | None = request.app.state.run
    if run is not None and not run.done.is_set():
        return JSONResponse({"error": "a run is in progress; DELETE /train first"}, 409)
    run = request.app.state.run = Run()
    request.app.state.tg.start_soon(run.train)
    return JSONResponse({"status": run.status}, 201)


async def events(request: Request) -> Response:
    run: Run | None = request.app.state.run
    if run is None:
        return JSONResponse({"error": "no run yet; POST /train"}, 404)

    async def body() -> AsyncIterator[str]:
        async with run.stream.subscribe(since=0) as sub:  # bounded: a slow client drops
            async for item in sub:
                yield item.to_sse()  # "id: 3\nevent: batch_end\ndata: {...}\n\n"
        await run.done.wait()
        yield f'event: end\ndata: {{"status": "{run.status}"}}\n\n'

    return StreamingResponse(body(), media_type="text/event-stream")


async def cancel(request: Request) -> Response:
    run: Run | None = request.app.state.run
    if run is None:
        return JSONResponse({"error": "no run yet; POST /train"}, 404)
    run.scope.cancel()
    await run.done.wait()  # close ran on every callback
    return JSONResponse({"status": run.status})


app = Starlette(
    routes=[
        Route("/train", start, methods=["POST"]),
        Route("/train", cancel, methods=["DELETE"]),
        Route("/train/events", events),
    ],
    lifespan=lifespan,
)
