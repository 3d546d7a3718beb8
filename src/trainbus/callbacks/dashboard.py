"""``Dashboard``: a live page for one local run, served on 127.0.0.1 while it trains.

The page (loss and eval curves, throughput, a callbacks panel and a timeline of the last
batches; ``docs/dashboard.md``) is the one ``trainbus.serve`` shows for its jobs. The
server (uvicorn, which needs asyncio whatever backend ``fit()`` runs on, and outlives the
run) runs on an asyncio loop of its own, a :class:`~trainbus.core.bridge.LoopThread`, so
browser tabs, slow or closed, never touch the training loop: the callback's handlers
(plain and cheap) only append each item to an outbox, and four times a second the
server's loop publishes what waits there into an
:class:`~trainbus.callbacks.EventStream` whose subscribers have bounded buffers; the
run's end wakes that loop through the bridge (:class:`~trainbus.core.bridge.LoopHandle`).
The bus snapshots (callbacks panel, timeline) are taken on the server's thread every
``snapshot_seconds`` while a tab watches (and once at the end of the run).
Needs ``pip install 'trainbus[service]'`` (Starlette, uvicorn).
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
import warnings
from collections import deque
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from trainbus.callbacks._stream_items import StreamEvent, StreamMetrics, json_ready
from trainbus.callbacks.event_stream import DEFAULT_STREAM_EVENTS, EventStream
from trainbus.core.bridge import LoopHandle, LoopThread
from trainbus.core.destination import LoggerDestination
from trainbus.core.events import Event
from trainbus.core.logger import LogRecord
from trainbus.core.renamed import renamed_option

if TYPE_CHECKING:
    from trainbus.bus.engine import Engine
    from trainbus.callbacks._bus_feed import BusFeed
    from trainbus.callbacks._dashboard_page import ConnectionHub
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["Dashboard"]


class _HasEngine(Protocol):
    """What :meth:`Dashboard.attach` needs of a trainer (``Trainer`` is a layer above)."""

    @property
    def engine(self) -> Engine: ...

_END = object()  # the outbox's marker: the run closed
_SEND_BUFFER = 64 * 1024
#: The events it handles: the stream's defaults but ``BATCH_END``, whose snapshot the
#: training thread would queue (and whose lane it would wake) at every batch; the page's
#: batch counter and throughput follow the batch-level records instead (:meth:`log_record`).
_EVENTS = DEFAULT_STREAM_EVENTS - {Event.BATCH_END}
#: How often the server's loop takes what the run sent (the page asks for 4 messages/s).
_FLUSH_S = 0.25


def _missing_extra(exc: ImportError) -> ImportError:
    return ImportError(
        f"Dashboard needs Starlette and uvicorn ({exc.name} is missing); install them "
        "with: pip install 'trainbus[service]'"
    )


class Dashboard(LoggerDestination):
    """Serves a live dashboard of this run at ``http://127.0.0.1:<port>/``.

    Pass it in ``loggers=[...]``: it sees the run's events and logged metrics, and the
    trainer's engine hands it the bus for the callbacks panel and the timeline (no other
    call needed). The server starts at :meth:`start` (or with the run) and
    keeps serving after the run, so the page can still be read, until :meth:`stop` or
    the end of a ``with`` block; its thread is a daemon.

    Args:
        host: The interface to listen on (default ``127.0.0.1``: this machine only).
        port: The port (``0``: any free port; read :attr:`url`).
        snapshot_seconds: Seconds between two bus snapshots (callbacks panel, timeline),
            taken while a tab watches.
        history: Items kept for tabs that open (or reconnect) later.
        token: Required on every request when set (:attr:`url` carries it; the page sets
            a cookie from it). On a ``host`` other than loopback one is generated when
            none is given, unless ``insecure_no_token=True``.
        allowed_hosts: ``Host`` names it answers besides ``localhost``, ``127.0.0.1``,
            ``[::1]`` and the address a request arrived on; ``["*"]``: any.
        interval: Deprecated name of ``snapshot_seconds`` (warns once).
        insecure_no_token: Serve other machines without a token (anyone who reaches the
            port reads the run).

    Attributes:
        stream: The server side's :class:`EventStream` (lives on the server's loop).
        token: The token requests need (``None``: none).

    Example:
        >>> with Dashboard() as dashboard:
        ...     trainer = Trainer(model, loader, "3ep", loggers=[dashboard])
        ...     print("open", dashboard.url)
        ...     trainer.fit_sync()
    """

    #: Its handlers only forward their event's snapshot to the page: they may trail training
    #: by a few batches instead of holding the ``BATCH_END`` barrier (``@trailing``).
    trailing = 4

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        snapshot_seconds: float = 0.5,
        history: int = 20_000,
        token: str | None = None,
        allowed_hosts: Iterable[str] = (),
        insecure_no_token: bool = False,
        interval: float | None = None,
    ) -> None:
        interval = renamed_option(
            "Dashboard", "interval", interval, "snapshot_seconds", snapshot_seconds, default=0.5
        )
        try:
            from trainbus.callbacks._guard import access_options, is_loopback
        except ImportError as exc:
            raise _missing_extra(exc) from exc
        if token is None and not is_loopback(host) and not insecure_no_token:
            token = secrets.token_urlsafe(32)  # printed with the url, as Jupyter does
        self._access = access_options(token, allowed_hosts, insecure_no_token, "dashboard")
        self.token = token
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port={port!r} must be an int from 0 to 65535 (0: any free port)")
        if isinstance(interval, bool) or not isinstance(interval, int | float) or not (
            interval > 0
        ):
            raise ValueError(f"snapshot_seconds={interval!r} must be seconds > 0, e.g. 0.5")
        self.host = host
        self.port = port
        self.snapshot_seconds = float(interval)
        self.stream = EventStream(history=history, buffer_size=history)
        self._feed: BusFeed | None = None
        self._running = False
        self._outbox: deque[Any] = deque(maxlen=max(history, 1024))
        self._flush_scheduled = False
        self._loop: LoopHandle | None = None  # the server's loop, while it serves
        self._thread: LoopThread | None = None
        self._server: Any = None
        self._hub: ConnectionHub | None = None
        self._started = threading.Event()
        self._delivered = threading.Event()
        self._status = "running"
        self._last_batch = -1  # the batch of the last batch_end sent to the page
        for event in _EVENTS:
            setattr(self, event.value, self._forwarder(event))

    # -- the server -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The page's address, with ``?token=`` if it has one (starts the server if needed)."""
        self.start()
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/" + (f"?token={self.token}" if self.token else "")

    def _bind_engine(self, engine: Engine) -> None:
        """Called by the engine it joins, once, when the engine is built (a private hook).

        The callbacks panel and the timeline follow that engine from now on (it starts
        recording its timeline, bounded).
        """
        from trainbus.callbacks._bus_feed import BusFeed

        self._feed = BusFeed(engine)

    def attach(self, trainer: _HasEngine) -> Dashboard:
        """Deprecated: a ``Dashboard`` in ``loggers=[...]`` finds its trainer by itself.

        Still follows ``trainer``'s bus (if it did not already) and returns the dashboard,
        with a :class:`DeprecationWarning`.
        """
        warnings.warn(
            "Dashboard.attach(trainer) is no longer needed: a Dashboard passed in "
            "Trainer(loggers=[...]) follows that trainer's bus by itself; remove the call",
            DeprecationWarning,
            stacklevel=2,
        )
        if self._feed is None or self._feed.engine is not trainer.engine:
            self._bind_engine(trainer.engine)
        return self

    def start(self) -> None:
        """Start serving (on a daemon thread); does nothing if it serves already."""
        if self._thread is not None and self._thread.is_alive():
            return
        try:
            from trainbus.callbacks._dashboard_page import ConnectionHub
        except ImportError as exc:
            raise _missing_extra(exc) from exc
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # A small send buffer (inherited by each connection): a tab that stops reading is
        # absorbed by its stream's bounded buffer, not by megabytes of kernel memory.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise OSError(
                f"Dashboard cannot listen on {self.host}:{self.port} ({exc.strerror}); "
                "pick another port=..., or port=0 for any free one"
            ) from exc
        self.port = sock.getsockname()[1]
        self._hub = ConnectionHub()
        self._started.clear()
        self._thread = LoopThread("trainbus-dashboard", backend="asyncio")
        self._thread.start_main(self._serve, sock)
        self._started.wait(timeout=10)

    async def _serve(self, sock: socket.socket) -> None:
        """Serve until :meth:`stop` (the server's loop)."""
        import uvicorn

        from trainbus.callbacks._dashboard_page import dashboard_app

        assert self._hub is not None
        app = dashboard_app(self.stream, self._end_data, self._hub, access=self._access)
        started = self._started

        class Server(uvicorn.Server):
            async def startup(self, sockets: list[socket.socket] | None = None) -> None:
                await super().startup(sockets=sockets)
                started.set()

        server = Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self._server = server

        async def ticker() -> None:
            tick = min(_FLUSH_S, self.snapshot_seconds)
            next_snapshot = time.monotonic() + self.snapshot_seconds
            while True:
                await anyio.sleep(tick)
                self._flush()
                if time.monotonic() >= next_snapshot:
                    next_snapshot = time.monotonic() + self.snapshot_seconds
                    # Nobody watches: no snapshot (a tab that opens gets one at its first
                    # tick; the recorder is bounded meanwhile).
                    feed, watched = self._feed, self.stream.statistics().subscribers > 0
                    if feed is not None and self._running:
                        if watched:
                            self.stream.publish(feed.snapshot())
                        else:
                            feed.take()

        try:
            self._loop = LoopHandle()
            self._flush()  # what the run published before (or while) the server was down
            async with anyio.create_task_group() as tg:
                tg.start_soon(ticker)
                await server.serve(sockets=[sock])
                tg.cancel_scope.cancel()
        finally:
            self._loop = None
            self._started.set()
            sock.close()

    def stop(self) -> None:
        """Stop serving: open tabs lose the stream (they retry until it comes back)."""
        thread, loop, server, hub = self._thread, self._loop, self._server, self._hub
        if thread is None:
            return
        if loop is not None and server is not None and hub is not None:

            def shut() -> None:
                hub.close_all()
                server.should_exit = True

            loop.call_soon_if_running(shut)  # nothing if the loop closed already
        thread.stop(timeout=10)
        self._thread = None

    def __enter__(self) -> Dashboard:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def _end_data(self, sub: Any) -> dict[str, Any]:
        return {"status": self._status, "error": None, "dropped": sub.dropped}

    # -- forwarding (training loop -> server loop) -------------------------------------------

    def _send(self, item: Any) -> None:
        # No wake-up per item: the server's loop takes the outbox every FLUSH_S seconds,
        # so a run of 1,000 batches/s costs the server a few dozen wake-ups a second, and
        # the training process's other threads a few dozen GIL hand-offs. The run's end
        # wakes it at once.
        self._outbox.append(item)
        if item is _END and not self._flush_scheduled:
            loop = self._loop
            if loop is None:
                return  # flushed when the server starts
            self._flush_scheduled = True
            # Nothing if the server stopped meanwhile: the next one flushes when it starts.
            loop.call_soon_if_running(self._flush)

    def _flush(self) -> None:
        """On the server's loop: publish what waits in the outbox.

        Also called when a server starts, which clears a wake-up the previous server's
        loop may have dropped when it stopped.
        """
        self._flush_scheduled = False
        outbox = self._outbox
        while outbox:
            item = outbox.popleft()
            if item is _END:
                self._running = False
                if self._feed is not None:  # the run's last snapshot
                    self.stream.publish(self._feed.snapshot())
                self.stream.end()
                self._delivered.set()
            else:
                if isinstance(item, StreamEvent) and item.event in (Event.INIT, Event.FIT_START):
                    self._running = True
                self.stream.publish(item)

    # The handlers are plain and cheap (an append, at most one wake-up of the server's
    # loop), for the run's and the epochs' events only: no BATCH_END (see _EVENTS and
    # log_record). Snapshots are taken on the server's thread.

    def _forwarder(self, event: Event) -> Any:
        def handler(state: State, logger: Logger) -> None:
            if event is Event.INIT or event is Event.FIT_START:
                self._status = "running"
                self._last_batch = -1
            if event is Event.FIT_START and (self._thread is None or not self._thread.is_alive()):
                self.start()
            if event is Event.FIT_END:
                self._status = "completed"
            self._send(StreamEvent(event, state.timestamp, time.time()))

        handler.__qualname__ = f"Dashboard.{event.value}"
        return handler

    def log_record(self, record: LogRecord) -> None:
        """Forward a logged record to the page, and the end of a batch it is the first of.

        The page's ``batch_end`` items (its batch counter and throughput) come from here:
        the first record logged with a new batch count marks that batch's end (the trainer
        logs ``loss/train`` at every batch; with ``log_train_loss=False`` it is whatever
        the run logs). So the Dashboard has no ``BATCH_END`` handler, and the training
        thread queues nothing for it per batch beyond the records themselves.
        """
        values = {k: json_ready(v) for k, v in record.metrics.items()}
        self._send(StreamMetrics(values, record.step, record.wall_time, 0, record.hyperparameters))
        ts = record.timestamp
        if ts is not None and not record.hyperparameters and int(ts.batch) > self._last_batch:
            self._last_batch = int(ts.batch)
            self._send(StreamEvent(Event.BATCH_END, ts, record.wall_time))

    def close(self, state: State, logger: Logger) -> None:
        """The run is over: a last snapshot, then the page's stream ends (``end``)."""
        if self._status == "running":
            self._status = "stopped"
        self._delivered.clear()
        self._send(_END)
        if self._loop is not None:  # so that the page has everything when fit() returns
            self._delivered.wait(timeout=5.0)
