"""The service's ``/metrics`` (every job's, a ``job_id`` label each) and its health answers.

Each job's :class:`~trainbus.callbacks.RunWatch` (``JobContext.watch``, in
``ctx.loggers``) is read at the scrape, on the server's event loop: no job's training
thread waits for it. The registry is the application's own (never the global one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse, Response

from trainbus.callbacks.prometheus import RunCollector, missing_extra

if TYPE_CHECKING:
    from trainbus.callbacks._run_watch import RunWatch
    from trainbus.serve._jobs import Job, JobManager

__all__ = ["ServiceMetrics", "job_health", "service_health"]


class ServiceMetrics:
    """The Prometheus exposition of a :class:`JobManager`'s jobs (``GET /metrics``)."""

    def __init__(self, manager: JobManager) -> None:
        self.manager = manager
        self.registry: Any = None
        self.missing: ImportError | None = None
        try:
            from prometheus_client import CollectorRegistry
        except ImportError as exc:
            self.missing = missing_extra(exc)
            return
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(RunCollector(self._runs))
        self.registry.register(_JobsCollector(manager))

    def _runs(self) -> list[tuple[dict[str, str], RunWatch]]:
        return [({"job_id": job.id}, job.watch) for job in self.manager.jobs() if job.watch]

    def response(self) -> Response:
        """The text exposition, or 501 naming the extra to install."""
        if self.registry is None:
            return JSONResponse({"error": str(self.missing)}, status_code=501)
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class _JobsCollector:
    def __init__(self, manager: JobManager) -> None:
        self.manager = manager

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        counts: dict[str, int] = {}
        for job in self.manager.jobs():
            counts[job.status.value] = counts.get(job.status.value, 0) + 1
        family = GaugeMetricFamily("trainbus_jobs", "Jobs the service keeps, by status",
                                   labels=["status"])  # fmt: skip
        for status, n in sorted(counts.items()):
            family.add_metric([status], n)
        yield family


def job_health(job: Job) -> dict[str, Any] | None:
    """A job's health (``None``: its factory did not attach ``ctx.watch``)."""
    return job.watch.health().as_dict() if job.watch is not None else None


def service_health(manager: JobManager) -> tuple[dict[str, Any], int]:
    """The service's ``/healthz`` body and status: 503 when a running job is stalled."""
    jobs = {job.id: job_health(job) for job in manager.jobs() if not job.done}
    stalled = sorted(i for i, h in jobs.items() if h is not None and h["status"] == "stalled")
    body = {"status": "stalled" if stalled else "ok", "running": manager.running,
            "stalled": stalled, "jobs": jobs}  # fmt: skip
    return body, (503 if stalled else 200)
