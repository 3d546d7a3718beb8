"""The dashboard's HTTP side: the ``Dashboard`` callback's, which the service's job pages share.

It lives beside the callback (``serve`` imports it from here, a layer above): a callback
never imports the service.

- :func:`dashboard_page`: the page (``static/dashboard.html``); its script opens an
  ``EventSource`` on ``events`` relative to the page's URL;
- :func:`static_files`: the page's script, style and the vendored uPlot (no CDN);
- :func:`sse_response`: an :class:`~trainbus.callbacks.EventStream` as server-sent events,
  replaying from ``?since=N`` or ``Last-Event-ID``, each client with a bounded buffer;
  with ``?pack=1&rate=N`` what arrives is coalesced into packs at most N times a second (the
  dashboard asks for 4; a replay of the history goes out in packs of at most 1,000 items), so
  a browser's work does not grow with the run's event rate.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from trainbus.callbacks._guard import Access, Guard
from trainbus.callbacks._stream_items import StreamBusSnapshot
from trainbus.callbacks.event_stream import EventStream, StreamOverflowError, Subscription

__all__ = [
    "STATIC_DIR",
    "ConnectionHub",
    "dashboard_app",
    "dashboard_page",
    "sse_message",
    "sse_response",
    "static_files",
]

#: The dashboard's files (HTML, JS, CSS, and ``vendor/uplot``), shipped in the wheel.
STATIC_DIR = Path(__file__).resolve().parent / "static"

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_MAX_CLIENT_BUFFER = 100_000
_MAX_RATE = 1000
#: Items per ``event: items`` message at most (a page's replay of the history is split).
_PACK_MAX = 1000
#: Milliseconds a browser waits before it reconnects a dropped stream (SSE ``retry:``).
RECONNECT_MS = 300


def sse_message(event: str, data: Any) -> str:
    """One server-sent event: ``event: <event>\\ndata: <json>\\n\\n``.

    Example:
        >>> sse_message("end", {"status": "completed"})
        'event: end\\ndata: {"status":"completed"}\\n\\n'
    """
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _flag(request: Request, name: str) -> bool:
    return request.query_params.get(name, "0") not in ("0", "", "false")


def _packed(items: list[Any]) -> str:
    """``items`` as one SSE message: ``id`` of the last numbered item, data a JSON array.

    Each item's JSON is encoded once and kept by the item (``to_json()``), so a page that
    opens mid-run replays the history by joining strings, not by encoding it again.
    """
    if not items:
        return ""
    last = next((i.seq for i in reversed(items) if getattr(i, "seq", None) is not None), None)
    head = f"id: {last}\n" if last is not None else ""
    body = ",".join([item.to_json() for item in items])
    return f"{head}event: items\ndata: [{body}]\n\n"


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def dashboard_page(title: str) -> HTMLResponse:
    """The dashboard page, titled ``title``; it streams from ``events`` next to its URL.

    Example:
        >>> dashboard_page("job 3f2a9c").status_code
        200
    """
    html = (STATIC_DIR / "dashboard.html").read_text(encoding="utf-8")
    safe = title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return HTMLResponse(html.replace("{{TITLE}}", safe), headers={"Cache-Control": "no-cache"})


def static_files() -> StaticFiles:
    """The page's static files, to mount at ``/static``."""
    return StaticFiles(directory=STATIC_DIR)


class ConnectionHub:
    """The SSE connections of one server, so that a restart can cut them all.

    After :meth:`close_all`, the streams end without an ``end`` event: browsers reconnect
    (with ``Last-Event-ID``) and resume where they were.
    """

    def __init__(self) -> None:
        self.subscriptions: set[Subscription] = set()
        self.closing = False

    def close_all(self) -> None:
        """End every open stream without ``end`` (the clients will reconnect)."""
        self.closing = True
        for sub in list(self.subscriptions):
            sub.close()


def _buffer(request: Request) -> int | JSONResponse | None:
    raw = request.query_params.get("buffer")
    if raw is None:
        return None
    try:
        size = int(raw)
    except ValueError:
        size = 0
    if not 1 <= size <= _MAX_CLIENT_BUFFER:
        return _error(400, f"buffer={raw!r} must be an int from 1 to {_MAX_CLIENT_BUFFER}")
    return size


def _rate(request: Request, pack: bool) -> float | JSONResponse | None:
    raw = request.query_params.get("rate")
    if raw is None:
        return None
    try:
        rate = float(raw)
    except ValueError:
        rate = 0.0
    if not 0 < rate <= _MAX_RATE:
        return _error(400, f"rate={raw!r} must be messages per second, > 0 and <= {_MAX_RATE}")
    if not pack:
        return _error(400, f"rate={raw!r} needs pack=1 (items are coalesced into packs)")
    return rate


def _since(request: Request) -> int | JSONResponse:
    """Where a stream starts: after ``Last-Event-ID`` (a reconnect), ``?since=N``, or 0.

    A reconnecting ``EventSource`` requests the same URL again, ``?since=`` included, and
    sends ``Last-Event-ID``: that header wins, so a reconnect resumes without duplicates.
    """
    last = request.headers.get("last-event-id")
    raw = request.query_params.get("since")
    try:
        if last is not None and last.strip():
            since = int(last) + 1
        elif raw is not None:
            since = int(raw)
        else:
            return 0
    except ValueError:
        return _error(400, f"since={raw!r} / Last-Event-ID={last!r} must be an item number")
    if since < 0:
        return _error(400, f"since={since} must be >= 0 (an item number)")
    return since


def sse_response(
    request: Request,
    stream: EventStream,
    end: Callable[[Subscription], Awaitable[dict[str, Any]]],
    hub: ConnectionHub | None = None,
) -> Response:
    """``stream`` as server-sent events for this request, then ``event: end``.

    Query: ``?since=N`` (replay from item N; ``Last-Event-ID`` wins), ``?buffer=N`` (this
    client's buffer), ``?bus=1`` (include the bus snapshots, ``event: bus``), ``?pack=1``
    (what is buffered at each wake-up goes out as one ``event: items`` whose data is a JSON
    array of the items and whose ``id`` is the last one's: a browser then handles a few
    messages a second instead of one per item; more than 1,000 items, as in a replay of the
    history, go out as several such messages back to back), ``?rate=N`` with ``pack=1`` (at
    most N wake-ups a second: what arrives meanwhile waits for the next, in this client's
    bounded buffer).

    Args:
        request: The request.
        stream: The stream to follow.
        end: Builds the ``end`` event's data once the stream ended.
        hub: Where the connection is registered (see :class:`ConnectionHub`).
    """
    since = _since(request)
    if isinstance(since, Response):
        return since
    buffer = _buffer(request)
    if isinstance(buffer, Response):
        return buffer
    with_bus = _flag(request, "bus")
    pack = _flag(request, "pack")
    rate = _rate(request, pack)
    if isinstance(rate, Response):
        return rate
    # Subscribe before the response starts, so that nothing published in between is lost.
    sub = stream.subscribe(since=since, buffer_size=buffer)
    return StreamingResponse(
        _body(sub, end, hub, with_bus, pack, 1.0 / rate if rate else 0.0),
        media_type="text/event-stream",
        headers=_SSE_HEADERS,
    )


async def _body(
    sub: Subscription,
    end: Callable[[Subscription], Awaitable[dict[str, Any]]],
    hub: ConnectionHub | None,
    with_bus: bool,
    pack: bool,
    spacing: float,
) -> AsyncIterator[str]:
    if hub is not None:
        hub.subscriptions.add(sub)
    try:
        if with_bus:
            yield f"retry: {RECONNECT_MS}\n\n"
        async with sub:
            try:
                next_at = 0.0
                async for first in sub:
                    if spacing:  # ?rate=N: wait for the pack's turn; items gather meanwhile
                        now = anyio.current_time()
                        if now < next_at:
                            await anyio.sleep(next_at - now)
                        next_at = max(now, next_at) + spacing
                    # One write for everything buffered: fewer sends under a burst.
                    ready = [
                        item
                        for item in (first, *sub.take_ready())
                        if with_bus or not isinstance(item, StreamBusSnapshot)
                    ]
                    if pack:  # a replay goes out in several packs, the loop free between
                        for start in range(0, len(ready), _PACK_MAX):
                            if start:
                                await anyio.lowlevel.checkpoint()
                            yield _packed(ready[start:start + _PACK_MAX])
                    elif ready:
                        yield "".join(item.to_sse() for item in ready)
            except StreamOverflowError as exc:
                yield sse_message("disconnected", {"reason": str(exc), "dropped": sub.dropped})
                return
        if hub is not None and hub.closing:
            return  # the server restarts: no `end`, so the browser reconnects
        yield sse_message("end", await end(sub))
    finally:
        if hub is not None:
            hub.subscriptions.discard(sub)


def dashboard_app(
    stream: EventStream,
    end: Callable[[Subscription], Awaitable[dict[str, Any]]],
    hub: ConnectionHub,
    title: str = "trainbus run",
    access: Access | None = None,
) -> Starlette:
    """The single-run dashboard's application: ``/``, ``/events`` and ``/static``.

    Args:
        stream: The run's stream (fed by the ``Dashboard`` callback).
        end: Builds the ``end`` event's data.
        hub: Registers the SSE connections, so that stopping the server cuts them.
        title: The page's title.
        access: Who it answers (:class:`~trainbus.callbacks._guard.Guard`, the service's
            checks); default: loopback names only, no token.
    """

    async def page(request: Request) -> Response:
        return dashboard_page(title)

    async def events(request: Request) -> Response:
        return sse_response(request, stream, end, hub)

    return Starlette(
        routes=[
            Route("/", page, methods=["GET"]),
            Route("/events", events, methods=["GET"]),
            Mount("/static", app=static_files(), name="static"),
        ],
        middleware=[Middleware(Guard, access=access or Access())],
    )
