"""A local HTTP server that answers every POST after an added latency (stdlib only).

Stands in for a metrics service in the upload scenario (e) of the benchmarks.

In-process::

    with LatencyServer(latency_ms=20) as server:
        post_to(server.url)        # http://127.0.0.1:<port>/
        server.requests            # POSTs answered so far

``GET /`` answers ``{"requests": ..., "connections": ..., "cpu_s": ...}``: POSTs answered,
connections accepted and the server process's CPU seconds so far (``time.process_time()``),
so a benchmark can charge the server's CPU to the run that caused it.

As a process (prints its URL on the first line of stdout, then serves until killed)::

    python benchmarks/latency_server.py --port 0 --latency-ms 20
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; without TCP_NODELAY a keep-alive client
    # waits ~40 ms for the delayed ACK between them.
    disable_nagle_algorithm = True
    server: _Server

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def do_GET(self) -> None:
        with self.server.lock:
            counts = (self.server.requests, self.server.connections)
        body = json.dumps(
            {"requests": counts[0], "connections": counts[1], "cpu_s": time.process_time()}
        ).encode()
        self._reply(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        time.sleep(self.server.latency_s)
        self._reply(b'{"ok": true}')
        with self.server.lock:
            self.server.requests += 1

    def _reply(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # keep the benchmark output clean
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, latency_s: float) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.latency_s = latency_s
        self.requests = 0
        self.connections = 0
        self.lock = threading.Lock()


class LatencyServer:
    """Serve on 127.0.0.1 (port 0: any free port) in a daemon thread while the `with` block runs."""

    def __init__(self, port: int = 0, latency_ms: float = 20.0) -> None:
        self._server = _Server(port, latency_ms / 1000)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/"

    @property
    def requests(self) -> int:
        return self._server.requests

    def __enter__(self) -> LatencyServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    args = parser.parse_args()
    server = _Server(args.port, args.latency_ms / 1000)
    host, port = server.server_address[:2]
    print(f"http://{host}:{port}/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
