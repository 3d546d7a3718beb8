"""``python -m trainbus.serve``: run the training service with the demo job.

Example:
    $ python -m trainbus.serve --port 8000 --max-running 2
    $ curl -X POST localhost:8000/jobs -d '{"epochs": 2, "batches": 20}'
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from trainbus.serve._app import create_app
from trainbus.serve._server import create_server

__all__ = ["main"]


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
    parser.add_argument("--log-level", default="info", help="uvicorn log level")
    args = parser.parse_args(argv)
    app = create_app(
        max_running="auto" if args.max_running is None else args.max_running,
        stream_buffer=args.stream_buffer,
    )
    server = create_server(app, host=args.host, port=args.port, log_level=args.log_level)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its graceful shutdown
        pass


if __name__ == "__main__":
    main()
