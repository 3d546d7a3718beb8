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

from trainbus.callbacks._guard import Access, check_bind
from trainbus.serve._jobs import JobManager

__all__ = ["TrainbusServer", "create_server"]


class TrainbusServer(uvicorn.Server):
    """A ``uvicorn.Server`` that cancels running jobs before it drains connections.

    Attributes:
        jobs: The application's :class:`JobManager`.
        token: The application's token (``None``: none), for :attr:`url`.
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

    def __init__(self, config: uvicorn.Config, jobs: JobManager, token: str | None = None) -> None:
        super().__init__(config)
        self.jobs = jobs
        self.token = token
        self.ready = asyncio.Event()

    @property
    def url(self) -> str:
        """The service's address, with ``?token=`` when it has one (to open in a browser)."""
        host = self.config.host
        host = f"[{host}]" if ":" in host else host
        query = f"?token={self.token}" if self.token else ""
        return f"http://{host}:{self.port}/{query}"

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

    Raises:
        ValueError: ``host`` is not loopback and the app has no token
            (``create_app(token=...)``) nor ``insecure_no_token=True``.

    Example:
        >>> create_server(create_app(), port=8000).run()     # blocks, like uvicorn.run
    """
    jobs = getattr(app.state, "jobs", None)
    if not isinstance(jobs, JobManager):
        raise TypeError(
            "create_server(app) needs an application made by trainbus.serve.create_app "
            "(app.state.jobs is its JobManager); for another app use uvicorn.Server"
        )
    access: Access = app.state.access
    check_bind(host, access, "create_app(token=secrets.token_urlsafe(32))")
    uv_config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, lifespan="on", **config
    )
    return TrainbusServer(uv_config, jobs, access.token)
