"""Running the application under uvicorn, with a shutdown that does not wait on streams.

uvicorn shuts down in this order: stop accepting, wait for open connections to finish,
then run the application's lifespan shutdown. An SSE client following a running job
keeps its connection open until the job closes, and the job is only cancelled by the
lifespan shutdown, so plain uvicorn waits for the job to finish on its own (or until
``timeout_graceful_shutdown``). :class:`TrainbusServer` cancels the jobs first: their
streams end, their clients receive ``event: end``, and the connections close.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn
from starlette.applications import Starlette

from trainbus.serve._jobs import JobManager

__all__ = ["TrainbusServer", "create_server"]


class TrainbusServer(uvicorn.Server):
    """A ``uvicorn.Server`` that cancels running jobs before it drains connections.

    Attributes:
        jobs: The application's :class:`JobManager`.
        ready: An ``asyncio.Event`` set once the server listens.

    Example:
        >>> server = create_server(create_app(), port=0)
        >>> task = asyncio.create_task(server.serve())
        >>> await server.ready.wait()
        >>> url = f"http://127.0.0.1:{server.port}"
        >>> ...
        >>> server.should_exit = True
        >>> await task
    """

    def __init__(self, config: uvicorn.Config, jobs: JobManager) -> None:
        super().__init__(config)
        self.jobs = jobs
        self.ready = asyncio.Event()

    @property
    def port(self) -> int:
        """The port the server listens on (useful with ``port=0``)."""
        if not self.servers or not self.servers[0].sockets:
            raise RuntimeError("the server is not listening yet; await server.ready.wait()")
        port: int = self.servers[0].sockets[0].getsockname()[1]
        return port

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Start as uvicorn does, then set :attr:`ready`."""
        await super().startup(sockets=sockets)
        if self.started:
            self.ready.set()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Cancel the jobs (their SSE streams end), then shut down as uvicorn does."""
        await self.jobs.shutdown()
        await super().shutdown(sockets=sockets)


def create_server(
    app: Starlette,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "warning",
    **config: Any,
) -> TrainbusServer:
    """A :class:`TrainbusServer` for an application made by :func:`create_app`.

    Args:
        app: The application (its job manager is ``app.state.jobs``).
        host: The interface to listen on.
        port: The port (``0``: any free port; read it from ``server.port``).
        log_level: uvicorn's log level.
        **config: Further ``uvicorn.Config`` arguments.

    Example:
        >>> create_server(create_app(), port=8000).run()     # blocks, like uvicorn.run
    """
    jobs = getattr(app.state, "jobs", None)
    if not isinstance(jobs, JobManager):
        raise TypeError(
            "create_server(app) needs an application made by trainbus.serve.create_app "
            "(app.state.jobs is its JobManager); for another app use uvicorn.Server"
        )
    uv_config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, lifespan="on", **config
    )
    return TrainbusServer(uv_config, jobs)
