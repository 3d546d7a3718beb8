"""trainbus.serve: training jobs behind an HTTP API, their events as server-sent events.

An optional part of trainbus (``pip install 'trainbus[service]'``: Starlette, uvicorn).
:func:`create_app` returns a Starlette application whose lifespan owns a task group;
``POST /jobs`` builds a :class:`~trainbus.Trainer` with your job factory and runs its
``fit()`` there, on the server's event loop, while training itself runs on a worker
thread, so the service keeps answering requests. See ``docs/service.md``.

Example:
    >>> from trainbus.serve import create_app, create_server
    >>> create_server(create_app(), port=8000).run()
    $ curl --json '{"epochs": 2, "batches": 20}' localhost:8000/jobs
    $ curl -N localhost:8000/jobs/<id>/events

Or from a shell: ``python -m trainbus.serve --port 8000``.
"""

from __future__ import annotations

try:
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:
    raise ImportError(
        f"trainbus.serve needs Starlette and uvicorn ({exc.name} is missing); install them "
        "with: pip install 'trainbus[service]'"
    ) from exc

from trainbus.serve._app import create_app as create_app
from trainbus.serve._app import sse_message as sse_message
from trainbus.serve._demo import DemoMLP as DemoMLP
from trainbus.serve._demo import demo_job_factory as demo_job_factory
from trainbus.serve._jobs import Job as Job
from trainbus.serve._jobs import JobContext as JobContext
from trainbus.serve._jobs import JobFactory as JobFactory
from trainbus.serve._jobs import JobFactoryError as JobFactoryError
from trainbus.serve._jobs import JobManager as JobManager
from trainbus.serve._jobs import JobStatus as JobStatus
from trainbus.serve._jobs import LatestMetrics as LatestMetrics
from trainbus.serve._jobs import ServiceClosedError as ServiceClosedError
from trainbus.serve._jobs import TooManyJobsError as TooManyJobsError
from trainbus.serve._jobs import default_max_running as default_max_running
from trainbus.serve._server import TrainbusServer as TrainbusServer
from trainbus.serve._server import create_server as create_server

__all__ = (
    "DemoMLP",
    "Job",
    "JobContext",
    "JobFactory",
    "JobFactoryError",
    "JobManager",
    "JobStatus",
    "LatestMetrics",
    "ServiceClosedError",
    "TooManyJobsError",
    "TrainbusServer",
    "create_app",
    "create_server",
    "default_max_running",
    "demo_job_factory",
    "sse_message",
)
