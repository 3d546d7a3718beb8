"""moto's S3 server on 127.0.0.1 (for the tests, the docs and the benchmark), and a proxy
in front of it that drops the first upload half-way through its body."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["DroppingProxy", "moto_s3"]


@contextmanager
def moto_s3() -> Iterator[str]:
    """A ``ThreadedMotoServer`` on a free port of 127.0.0.1; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def s3_client(endpoint: str) -> object:
    """A boto3 client for checking what the server holds (the tests' own eyes)."""
    import boto3

    return boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )  # fmt: skip


class DroppingProxy:
    """A TCP proxy to ``upstream`` that cuts the first request whose body is larger than
    ``min_body`` bytes after half of its body (the server sees a connection reset mid-body);
    given a ``gate``, it cuts nothing but holds such requests until the gate is set.

    Attributes:
        endpoint: The proxy's URL.
        dropped: Connections cut so far; ``dropped_event`` is set at the first.
        connections: Connections accepted.
    """

    def __init__(self, upstream: str, min_body: int, gate: threading.Event | None = None) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self._upstream = (host, int(port))
        self._min_body = min_body
        self._gate = gate
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.dropped = 0
        self._cut = gate is None
        self.connections = 0
        self.dropped_event = threading.Event()
        self._lock = threading.Lock()
        self._closing = False
        self._threads: list[threading.Thread] = []
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self._upstream)
        back = threading.Thread(target=self._pump, args=(upstream, client), daemon=True)
        back.start()
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = client.recv(65536)
                if not chunk:
                    return
                head += chunk
            header = head.split(b"\r\n\r\n", 1)[0].lower()
            length = 0
            for line in header.split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if self._gate is not None and length > self._min_body:
                self._gate.wait()  # large bodies wait for the test to open the gate
            with self._lock:
                cut = length > self._min_body and self.dropped == 0 and self._cut
                if cut:
                    self.dropped += 1
            if cut:  # forward the head and half of the body, then reset both sides
                upstream.sendall(head)
                forwarded = len(head) - len(header) - 4
                while forwarded < length // 2:
                    chunk = client.recv(65536)
                    if not chunk:
                        break
                    upstream.sendall(chunk)
                    forwarded += len(chunk)
                for s in (client, upstream):
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.dropped_event.set()
                return
            upstream.sendall(head)
            self._pump(client, upstream)
        except OSError:
            pass
        finally:
            for s in (client, upstream):
                try:
                    s.close()
                except OSError:
                    pass

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self) -> None:
        """Stop accepting; connections in progress end with their peers."""
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self._listener.close()
        self._accepter.join()
