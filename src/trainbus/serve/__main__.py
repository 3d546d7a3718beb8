"""``python -m trainbus.serve``: run the training service with the demo job.

Example:
    $ python -m trainbus.serve --port 8000 --max-running 2
    $ curl --json '{"epochs": 2, "batches": 20}' localhost:8000/jobs

On loopback (the default) it needs no token unless ``--token`` sets one. On any other
address it generates one and prints the URL with it (as Jupyter does), unless
``--token`` gives one or ``--insecure-no-token`` says to serve other machines without.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
from collections.abc import Sequence

import anyio

from trainbus.callbacks._guard import is_loopback
from trainbus.serve._app import create_app
from trainbus.serve._server import TrainbusServer, create_server

__all__ = ["main"]


async def _serve(server: TrainbusServer) -> None:
    """Serve; print the URL (with its token) once it listens."""
    task = asyncio.create_task(server.serve())
    ready = asyncio.create_task(server.ready.wait())
    await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
    if ready.done():
        print(f"trainbus.serve: {server.url}", flush=True)
    else:
        ready.cancel()
    await task


def main(argv: Sequence[str] | None = None) -> None:
    """Parse arguments and serve until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m trainbus.serve",
        description="Serve trainbus training jobs over HTTP (the demo MLP job).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any)")
    parser.add_argument(
        "--max-running",
        type=int,
        default=None,
        help="jobs at once (default: one per CPU core; more get 429)",
    )
    parser.add_argument("--stream-buffer", type=int, default=256, help="SSE items per client")
    parser.add_argument(
        "--token",
        default=None,
        help="require this token on every request (default: none on loopback; "
        "generated and printed with the URL on any other --host)",
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests whose Host is NAME (repeatable; '*': any); by default "
        "only localhost, 127.0.0.1, [::1] and the address a request arrived on",
    )
    parser.add_argument(
        "--insecure-no-token",
        action="store_true",
        help="serve other machines without a token: anyone who reaches the port can "
        "start, read and cancel jobs",
    )
    parser.add_argument("--log-level", default="info", help="uvicorn log level")
    args = parser.parse_args(argv)
    token = args.token
    if token is None and not is_loopback(args.host) and not args.insecure_no_token:
        token = secrets.token_urlsafe(32)
    app = create_app(
        max_running="auto" if args.max_running is None else args.max_running,
        stream_buffer=args.stream_buffer,
        token=token,
        allowed_hosts=args.allow_host,
        insecure_no_token=args.insecure_no_token,
    )
    server = create_server(app, host=args.host, port=args.port, log_level=args.log_level)
    try:
        anyio.run(_serve, server, backend="asyncio")  # uvicorn serves on asyncio
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its graceful shutdown
        pass


if __name__ == "__main__":
    main()
