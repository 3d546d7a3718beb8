"""The HTTP API: ``create_app(job_factory)`` returns a Starlette application.

Routes::

    POST   /jobs               start a job (JSON body: the job's parameters)   201 / 415
    GET    /jobs               every job's status                              200
    GET    /jobs/{id}          status, progress and latest metrics             200 / 404
    GET    /jobs/{id}/events   server-sent events until the job closes         200 / 404
                               (?since=N, or Last-Event-ID: replay from item N;
                                ?buffer=N: this client's server-side buffer;
                                ?bus=1: with the bus snapshots;
                                ?pack=1&rate=N: packs of items, at most N/s)
    GET    /jobs/{id}/dashboard  the job's live dashboard (HTML)               200 / 404
    GET    /static/...         the dashboard's script, style and uPlot         200
    DELETE /jobs/{id}          cancel (waits until its callbacks closed)       200 / 404
    GET    /jobs/{id}/healthz  whether the job's batches complete              200 / 503 / 404
    GET    /healthz            liveness: 503 when a running job is stalled     200 / 503
    GET    /metrics            Prometheus metrics of every job (``job_id``)   200 / 501

Every request passes :class:`~trainbus.callbacks._guard.Guard` first (the ``Host`` check, the
token if there is one, same-origin JSON writes).

Jobs run in a task group owned by the application's lifespan, so they live on the
server's event loop next to the request handlers and are cancelled (and closed) when the
application shuts down.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from trainbus.callbacks._dashboard_page import (
    dashboard_page,
    sse_message,
    sse_response,
    static_files,
)
from trainbus.callbacks._guard import Guard, access_options
from trainbus.callbacks.event_stream import Subscription
from trainbus.core.renamed import renamed_option
from trainbus.serve._body import parse_params
from trainbus.serve._jobs import (
    Job,
    JobFactory,
    JobFactoryError,
    JobManager,
    ServiceClosedError,
    TooManyJobsError,
)
from trainbus.serve._metrics import ServiceMetrics, job_health, service_health

__all__ = ["DEFAULT_MAX_BODY_BYTES", "create_app", "sse_message"]

#: The largest ``POST /jobs`` body :func:`create_app` accepts by default (1 MiB).
DEFAULT_MAX_BODY_BYTES = 1 << 20

def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _manager(request: Request) -> JobManager:
    jobs: JobManager = request.app.state.jobs
    return jobs


def _job(request: Request) -> Job | JSONResponse:
    job_id = request.path_params["job_id"]
    job = _manager(request).get(job_id)
    if job is None:
        return _error(404, f"no job {job_id!r}; GET /jobs lists the jobs")
    return job


async def healthz(request: Request) -> Response:
    """``GET /healthz``: the service answers, how many jobs run, and each running job's
    health; 503 when one of them is stalled (``docs/watching-a-run.md``)."""
    body, status = service_health(_manager(request))
    return JSONResponse(body, status_code=status)


async def metrics(request: Request) -> Response:
    """``GET /metrics``: every job's Prometheus metrics (501 without prometheus_client)."""
    exposition: ServiceMetrics = request.app.state.metrics
    return exposition.response()


async def job_healthz(request: Request) -> Response:
    """``GET /jobs/{id}/healthz``: whether the job's batches complete (503 when not)."""
    job = _job(request)
    if isinstance(job, JSONResponse):
        return job
    health = job_health(job)
    if health is None:
        return _error(404, f"job {job.id!r} has no watch: its factory did not pass ctx.loggers")
    return JSONResponse(health, status_code=200 if health["ok"] else 503)


class _BodyTooLarge(Exception):
    pass


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (before reading it whole) one over ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


async def start_job(request: Request) -> Response:
    """``POST /jobs``: build a job from the JSON body and start it."""
    limit: int = request.app.state.max_body_bytes
    try:
        body = await _read_body(request, limit)
    except _BodyTooLarge:
        return _error(
            413,
            f"the body is larger than max_body_bytes={limit}; send the job's parameters "
            "only (or raise create_app(max_body_bytes=...))",
        )
    params = parse_params(body)
    if isinstance(params, str):
        return _error(400, params)
    try:
        job = await _manager(request).start(params)
    except JobFactoryError as exc:
        return _error(500, str(exc))
    except (ValueError, TypeError, KeyError) as exc:
        return _error(400, _short(str(exc.args[0]) if exc.args else repr(exc)))
    except TooManyJobsError as exc:
        return JSONResponse({"error": str(exc)}, status_code=429, headers={"Retry-After": "1"})
    except ServiceClosedError as exc:
        return _error(503, str(exc))
    return JSONResponse(job.to_dict(), status_code=201, headers={"Location": f"/jobs/{job.id}"})


async def list_jobs(request: Request) -> Response:
    """``GET /jobs``: every job known, oldest first."""
    return JSONResponse([job.to_dict() for job in _manager(request).jobs()])


async def get_job(request: Request) -> Response:
    """``GET /jobs/{id}``: status, progress and latest metrics."""
    job = _job(request)
    if isinstance(job, Response):
        return job
    return JSONResponse(job.to_dict())


async def cancel_job(request: Request) -> Response:
    """``DELETE /jobs/{id}``: cancel, wait until its callbacks closed, return its status."""
    job = _job(request)
    if isinstance(job, Response):
        return job
    job.cancel()
    await job.wait()
    return JSONResponse(job.to_dict())


async def job_events(request: Request) -> Response:
    """``GET /jobs/{id}/events``: the job's stream as server-sent events, then ``end``.

    The stream starts with what the job's stream still keeps (from ``?since=N``, or
    after ``Last-Event-ID``, which wins), then follows the job live. ``?buffer=N`` sets
    how many items may wait for this client before its oldest are dropped; ``?bus=1``
    adds the bus snapshots (``event: bus``) the dashboard draws; ``?pack=1&rate=N``
    sends what arrives as at most N ``event: items`` messages a second.
    """
    job = _job(request)
    if isinstance(job, Response):
        return job

    async def end(sub: Subscription) -> dict[str, Any]:
        status = await job.wait()
        return {"status": status.value, "error": job.error, "dropped": sub.dropped}

    return sse_response(request, job.stream, end)


async def job_dashboard(request: Request) -> Response:
    """``GET /jobs/{id}/dashboard``: the job's live dashboard page."""
    job = _job(request)
    if isinstance(job, Response):
        return job
    return dashboard_page(f"trainbus job {job.id}")


def create_app(
    job_factory: JobFactory | None = None,
    *,
    max_running: int | Literal["auto"] | None = "auto",
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    keep_finished: int = 100,
    buffer_size: int = 256,
    stream_events: Any = None,
    stream_history: int = 1024,
    dashboard: bool = True,
    token: str | None = None,
    allowed_hosts: Iterable[str] = (),
    insecure_no_token: bool = False,
    debug: bool = False,
    stream_buffer: int | None = None,
) -> Starlette:
    """A Starlette application that runs training jobs and streams their events.

    Args:
        job_factory: Builds a job's trainer from a :class:`JobContext` (the request's
            parameters and the loggers to attach); default :func:`demo_job_factory`.
        max_running: At most this many jobs at once; more get 429 with ``Retry-After: 1``
            (nothing queues: the client decides when to retry). ``"auto"`` (default):
            :func:`default_max_running`, one per CPU core this process may use; ``None``:
            no limit.
        max_body_bytes: The largest ``POST /jobs`` body accepted; larger ones get 413
            before they are read whole (default 1 MiB).
        keep_finished: Finished jobs kept for the status endpoints.
        buffer_size: Items each SSE client may have waiting server-side; a client that
            reads slower loses its oldest items (an ``event: gap`` tells how many).
        stream_events: The events streamed (see :class:`~trainbus.callbacks.EventStream`).
        stream_history: Items each job keeps for clients that connect late (an SSE client
            first receives what is kept, then follows the job live).
        dashboard: Whether each job's stream also carries bus snapshots (statistics and
            timeline, every 0.5 s) for its ``/jobs/{id}/dashboard`` page; this records
            the job's timeline (``engine.record_trace()``, its latest spans only).
        token: Required on every request when set (``Authorization: Bearer <token>``, or
            ``?token=<token>`` once, which sets a cookie for the browser); needed to serve
            other machines. E.g. ``secrets.token_urlsafe(32)``.
        allowed_hosts: ``Host`` names accepted besides ``localhost``, ``127.0.0.1``,
            ``[::1]`` and the address a request arrived on (behind a proxy, or under a
            DNS name); ``["*"]`` accepts any (DNS rebinding then needs the token).
        insecure_no_token: Answer requests from other machines without a token: anyone
            who reaches the port can then start, read and cancel jobs.
        debug: Starlette's debug mode.
        stream_buffer: Deprecated name of ``buffer_size`` (warns once).

    Every request passes the checks of ``docs/service.md`` ("Who can reach it"): its
    ``Host`` names this server, it carries the token if there is one, and a write
    (``POST``, ``DELETE``) is same-origin and ``POST /jobs`` is ``application/json``.

    Returns:
        The application; its :class:`JobManager` is ``app.state.jobs``.

    Example:
        >>> app = create_app(demo_job_factory, max_running=2)
        >>> uvicorn.run(app, port=8000)     # or: create_server(app, port=8000).run()
    """
    if job_factory is None:
        from trainbus.serve._demo import demo_job_factory

        job_factory = demo_job_factory
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or (
        max_body_bytes < 1
    ):
        raise ValueError(f"max_body_bytes={max_body_bytes!r} must be an int >= 1, e.g. 1048576")
    access = access_options(token, allowed_hosts, insecure_no_token)
    manager = JobManager(
        job_factory,
        max_running=max_running,
        keep_finished=keep_finished,
        buffer_size=renamed_option(
            "create_app", "stream_buffer", stream_buffer, "buffer_size", buffer_size, default=256
        ),
        stream_events=stream_events,
        stream_history=stream_history,
        watch_bus=dashboard,
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with manager:
            yield

    routes = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/jobs/{job_id}/healthz", job_healthz, methods=["GET"]),
        Route("/jobs", start_job, methods=["POST"]),
        Route("/jobs", list_jobs, methods=["GET"]),
        Route("/jobs/{job_id}", get_job, methods=["GET"]),
        Route("/jobs/{job_id}", cancel_job, methods=["DELETE"]),
        Route("/jobs/{job_id}/events", job_events, methods=["GET"]),
        Route("/jobs/{job_id}/dashboard", job_dashboard, methods=["GET"]),
        Mount("/static", app=static_files(), name="static"),
    ]
    app = Starlette(
        debug=debug,
        routes=routes,
        middleware=[Middleware(Guard, access=access)],
        lifespan=lifespan,
    )
    app.state.jobs = manager
    app.state.metrics = ServiceMetrics(manager)
    app.state.access = access
    app.state.max_body_bytes = max_body_bytes
    return app
