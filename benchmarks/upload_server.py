"""The server side of scenario (g): ``latency_server.py`` in its own process, its counts, and
a minimal HTTP/1.1 client to compare ``httpx`` with."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import anyio.abc
import httpx

__all__ = ["RawClient", "latency_server", "server_counts"]


class RawClient:
    """HTTP/1.1 POSTs on one kept-alive connection, parsed by hand: about the least CPU a
    Python client can spend per request (``httpx`` spends several times more)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.stream: anyio.abc.SocketStream | None = None

    async def post(self, body: bytes) -> None:
        if self.stream is None:
            self.stream = await anyio.connect_tcp(self.host, self.port)
            sock = self.stream.extra(anyio.abc.SocketAttribute.raw_socket)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = (f"POST / HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        await self.stream.send(head.encode() + body)
        data = b""
        while b"\r\n\r\n" not in data:
            data += await self.stream.receive()
        head_bytes, _, rest = data.partition(b"\r\n\r\n")
        if not head_bytes.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"server answered {head_bytes[:40]!r}")
        found = re.search(rb"content-length: *(\d+)", head_bytes, re.IGNORECASE)
        length = int(found.group(1)) if found else 0
        while len(rest) < length:
            rest += await self.stream.receive()

    async def aclose(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()


def server_counts(url: str) -> dict[str, float]:
    """``GET url``: the server's POSTs answered, connections accepted and CPU seconds."""
    with httpx.Client() as client:
        out: dict[str, float] = client.get(url).json()
        return out


@contextlib.contextmanager
def latency_server(latency_ms: float) -> Iterator[str]:
    """``latency_server.py`` in its own process (its work does not share our GIL)."""
    script = Path(__file__).resolve().parent / "latency_server.py"
    cmd = [sys.executable, str(script), "--port", "0", "--latency-ms", str(latency_ms)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            yield proc.stdout.readline().strip()
        finally:
            proc.terminate()
