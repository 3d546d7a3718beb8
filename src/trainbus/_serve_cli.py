"""The service's command-line options, shared by ``trainbus serve`` and
``python -m trainbus.serve``: argparse only, so that ``trainbus --help`` stays cheap;
:func:`run` imports the service (Starlette, uvicorn, torch) when it starts it."""

from __future__ import annotations

import argparse
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainbus.serve._server import TrainbusServer

__all__ = ["add_arguments", "run"]


class _DeprecatedOption(argparse.Action):
    """An old option's name: warns once (naming the new one) and sets the new one's value."""

    def __init__(self, option_strings: list[str], dest: str, new: str = "", **kwargs: object):
        self.new = new
        super().__init__(option_strings, dest, **kwargs)  # type: ignore[arg-type]

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        warnings.warn(
            f"{option_string} is deprecated; use {self.new} (the same value)",
            DeprecationWarning,
            stacklevel=2,
        )
        setattr(namespace, self.dest, values)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number, e.g. 2") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1, e.g. 2")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number, e.g. 8000") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} must be a port from 0 to 65535")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The service's options on ``parser``."""
    parser.add_argument("--host", default="127.0.0.1", help="interface (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=8000, help="port (default 8000; 0: any)")
    parser.add_argument(
        "--max-running",
        type=_count,
        default=None,
        help="jobs at once (default: one per CPU core; more get 429)",
    )
    parser.add_argument(
        "--buffer-size",
        type=_count,
        default=256,
        help="server-sent events queued per client before its oldest are dropped (default 256)",
    )
    parser.add_argument(  # the name before the naming rule (CONTRIBUTING.md)
        "--stream-buffer",
        type=_count,
        dest="buffer_size",
        action=_DeprecatedOption,
        new="--buffer-size",
        help=argparse.SUPPRESS,
    )
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


def run(args: argparse.Namespace) -> int:
    """Serve the demo job with ``args`` until Ctrl-C; returns the exit status.

    On loopback (the default) it needs no token unless ``--token`` sets one. On any other
    address it generates one and prints the URL with it (as Jupyter does), unless
    ``--token`` gives one or ``--insecure-no-token`` says to serve other machines without.
    """
    import secrets

    try:
        from trainbus.serve import create_app, create_server
    except ImportError as exc:  # trainbus.serve names the extra to install
        raise SystemExit(f"trainbus serve: {exc}") from None
    import anyio

    from trainbus.callbacks._guard import is_loopback

    token = args.token
    if token is None and not is_loopback(args.host) and not args.insecure_no_token:
        token = secrets.token_urlsafe(32)
    app = create_app(
        max_running="auto" if args.max_running is None else args.max_running,
        buffer_size=args.buffer_size,
        token=token,
        allowed_hosts=args.allow_host,
        insecure_no_token=args.insecure_no_token,
    )
    server = create_server(app, host=args.host, port=args.port, log_level=args.log_level)
    try:
        anyio.run(_serve, server, backend="asyncio")  # uvicorn serves on asyncio
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its graceful shutdown
        pass
    return 0


async def _serve(server: TrainbusServer) -> None:
    """Serve; print the URL (with its token) once it listens."""
    import asyncio

    task = asyncio.create_task(server.serve())
    ready = asyncio.create_task(server.ready.wait())
    await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
    if ready.done():
        print(f"trainbus.serve: {server.url}", flush=True)
    else:
        ready.cancel()
    await task
