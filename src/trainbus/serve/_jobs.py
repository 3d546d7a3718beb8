"""Training jobs owned by a task group: start, observe, cancel, shut down.

Nothing here knows about HTTP. A :class:`JobManager` is an async context manager that
owns a task group; each :class:`Job` is one ``await trainer.fit()`` running in it, under
a cancel scope of its own, so cancelling a job (or leaving the manager) stops training
within one event and still runs every callback's ``close`` (SPEC D6, D11).
"""

from __future__ import annotations

import inspect
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

import anyio
import anyio.abc

from trainbus.callbacks._run_watch import JobWatch
from trainbus.callbacks._stream_items import json_ready
from trainbus.callbacks.event_stream import EventStream
from trainbus.core.destination import LoggerDestination
from trainbus.core.logger import LogRecord
from trainbus.core.renamed import renamed_option
from trainbus.serve._status import (
    JobFactoryError,
    JobStatus,
    ServiceClosedError,
    TooManyJobsError,
    default_max_running,
)
from trainbus.training.trainer import Trainer

__all__ = [
    "Job",
    "JobContext",
    "JobFactory",
    "JobFactoryError",
    "JobManager",
    "JobStatus",
    "LatestMetrics",
    "ServiceClosedError",
    "TooManyJobsError",
    "default_max_running",
]


class LatestMetrics(LoggerDestination):
    """A destination that keeps the latest value of each metric (JSON-ready).

    Its handler is ``async def``, so it runs on the event loop, next to the request
    handlers that read it.

    Attributes:
        values: The latest value of each metric.
        steps: The step of each latest value.
        hyperparameters: Everything logged with ``log_hyperparameters``.

    Example:
        >>> latest = LatestMetrics()
        >>> trainer = Trainer(..., loggers=[latest])
        >>> await trainer.fit()
        >>> latest.values["loss/train"]
        0.31
    """

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.steps: dict[str, int] = {}
        self.hyperparameters: dict[str, Any] = {}

    async def log_record(self, record: LogRecord) -> None:
        """Keep the record's values."""
        if record.hyperparameters:
            self.hyperparameters.update((k, json_ready(v)) for k, v in record.metrics.items())
            return
        for name, value in record.metrics.items():
            self.values[name] = json_ready(value)
            self.steps[name] = record.step


@dataclass(frozen=True)
class JobContext:
    """What a job factory gets: the request's parameters and the loggers to attach.

    The factory must pass :attr:`loggers` (the job's :class:`EventStream` and its
    :class:`LatestMetrics`) to the :class:`~trainbus.Trainer` it builds.

    Attributes:
        job_id: The new job's id.
        params: The parameters the client sent (a JSON object).
        stream: The job's event stream (the ``/events`` endpoint subscribes to it).
        metrics: The job's latest-metrics view (shown by ``GET /jobs/{id}``).
        watch: The job's :class:`~trainbus.callbacks.JobWatch` (its Prometheus metrics on
            the service's ``/metrics``, its health on ``/jobs/{id}/healthz``).
    """

    job_id: str
    params: Mapping[str, Any]
    stream: EventStream
    metrics: LatestMetrics = field(default_factory=LatestMetrics)
    watch: JobWatch = field(default_factory=JobWatch)

    @property
    def loggers(self) -> list[LoggerDestination]:
        """``[stream, metrics, watch]``: pass them as ``Trainer(..., loggers=ctx.loggers)``."""
        return [self.stream, self.metrics, self.watch]


#: Builds a job's trainer from its context; may be a coroutine function. It runs on the
#: event loop, so keep it cheap (load big data in a worker thread yourself). Raise
#: ``ValueError``/``TypeError`` for bad parameters: the service answers 400 with the
#: message.
JobFactory = Callable[[JobContext], Trainer | Awaitable[Trainer]]


def _account_of(trainer: Trainer) -> Callable[[], Mapping[str, float]] | None:
    """The parts of ``trainer``'s time account, for a trainer that keeps one."""
    read: Any = getattr(type(trainer), "time_account", None)  # a property, where it exists
    if read is None:
        return None
    return lambda: dict(read.__get__(trainer).parts())


class Job:
    """One training run owned by a :class:`JobManager`.

    Attributes:
        id: The job's id.
        params: The parameters it was created with.
        status: A :class:`JobStatus`.
        error: ``"ExceptionType: message"`` when it failed, else ``None``.
        trainer: The trainer.
        stream: The job's :class:`EventStream`.
        metrics: The job's :class:`LatestMetrics`.
        created_at, started_at, finished_at: ``time.time()`` stamps (or ``None``).
    """

    def __init__(self, ctx: JobContext, trainer: Trainer) -> None:
        self.id = ctx.job_id
        self.params = dict(ctx.params)
        self.trainer = trainer
        self.stream = ctx.stream
        self.metrics = ctx.metrics
        #: The job's watch, if the factory attached it (``ctx.loggers`` does), else ``None``.
        self.watch = ctx.watch if any(cb is ctx.watch for cb in trainer.state.callbacks) else None
        if self.watch is not None:
            self.watch.time_account = _account_of(trainer)
        self.status = JobStatus.PENDING
        self.error: str | None = None
        self.created_at = time.time()
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self._scope = anyio.CancelScope()
        self._done = anyio.Event()

    @property
    def done(self) -> bool:
        """Whether the job has finished and its callbacks have closed."""
        return self._done.is_set()

    def cancel(self) -> None:
        """Ask the job to stop; it closes its callbacks, then becomes ``cancelled``."""
        self._scope.cancel()

    async def wait(self) -> JobStatus:
        """Wait until the job has finished; returns its final status."""
        await self._done.wait()
        return self.status

    def to_dict(self) -> dict[str, Any]:
        """The job's status, progress and latest metrics, ready for JSON."""
        state = self.trainer.state
        stats = self.stream.statistics()
        return {
            "id": self.id,
            "status": self.status.value,
            "params": self.params,
            "max_duration": str(state.max_duration),
            "progress": state.timestamp.state_dict(),
            "metrics": dict(self.metrics.values),
            "metric_steps": dict(self.metrics.steps),
            "error": self.error,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "stream": {
                "subscribers": stats.subscribers,
                "published": stats.published,
                "dropped": stats.dropped,
                "disconnected": stats.disconnected,
            },
        }

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.status.value}>"


class JobManager:
    """Starts training jobs in a task group it owns; leaving it cancels what still runs.

    Args:
        job_factory: Builds each job's :class:`~trainbus.Trainer` (see :data:`JobFactory`).
        max_running: At most this many jobs run at once; more raise
            :class:`TooManyJobsError` (``"auto"``: :func:`default_max_running`, one per
            usable CPU core; ``None``: no limit).
        keep_finished: Finished jobs kept for ``get``/``jobs`` (oldest forgotten first).
        buffer_size: Items each event-stream subscriber may have waiting.
        stream_buffer: Deprecated name of ``buffer_size``.
        stream_events: The events jobs' streams publish (see :class:`EventStream`).
        stream_history: Items each job's stream keeps for late subscribers (``since=``).
        watch_bus: Whether each job's stream also publishes bus snapshots
            (:meth:`EventStream.watch`), for the dashboard.

    Example:
        >>> async with JobManager(my_factory) as jobs:
        ...     job = await jobs.start({"epochs": 2})
        ...     async for item in job.stream.subscribe():
        ...         print(item)
        ...     print(await job.wait())
        completed
    """

    def __init__(
        self,
        job_factory: JobFactory,
        *,
        max_running: int | Literal["auto"] | None = "auto",
        keep_finished: int = 100,
        buffer_size: int = 256,
        stream_events: Any = None,
        stream_history: int = 1024,
        watch_bus: bool = False,
        stream_buffer: int | None = None,
    ) -> None:
        if not callable(job_factory):
            raise TypeError(
                f"job_factory must be callable (ctx: JobContext) -> Trainer, "
                f"got {type(job_factory).__qualname__}"
            )
        if max_running == "auto":
            max_running = default_max_running()
        if max_running is not None and (
            isinstance(max_running, bool) or not isinstance(max_running, int) or max_running < 1
        ):
            raise ValueError(
                f"max_running={max_running!r} must be 'auto', None (no limit) or an int >= 1"
            )
        if not isinstance(keep_finished, int) or keep_finished < 0:
            raise ValueError(f"keep_finished={keep_finished!r} must be an int >= 0")
        buffer_size = renamed_option(
            "JobManager", "stream_buffer", stream_buffer, "buffer_size", buffer_size, default=256
        )
        # Validate the stream's arguments now rather than at the first job.
        EventStream(buffer_size=buffer_size, events=stream_events, history=stream_history)
        self.job_factory = job_factory
        self.max_running: int | None = max_running
        self.keep_finished = keep_finished
        self.buffer_size = buffer_size
        self.stream_events = stream_events
        self.stream_history = stream_history
        self.watch_bus = bool(watch_bus)
        self._jobs: dict[str, Job] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._stack: AsyncExitStack | None = None
        self._closing = False

    # -- lifecycle --------------------------------------------------------------------------

    async def __aenter__(self) -> JobManager:
        if self._stack is not None:
            raise RuntimeError("this JobManager is already running; create another one")
        stack = AsyncExitStack()
        self._tg = await stack.enter_async_context(anyio.create_task_group())
        self._stack = stack
        self._closing = False
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._closing = True
        for job in self._jobs.values():
            job.cancel()
        stack, self._stack = self._stack, None
        try:
            assert stack is not None
            return await stack.__aexit__(exc_type, exc, tb)
        finally:
            self._tg = None

    async def shutdown(self) -> None:
        """Refuse new jobs, cancel running ones and wait until they have closed."""
        self._closing = True
        running = [job for job in self._jobs.values() if not job.done]
        for job in running:
            job.cancel()
        with anyio.CancelScope(shield=True):
            for job in running:
                await job.wait()

    # -- jobs -------------------------------------------------------------------------------

    @property
    def running(self) -> int:
        """Jobs started and not finished."""
        return sum(1 for job in self._jobs.values() if not job.done)

    def jobs(self) -> list[Job]:
        """Every job known, oldest first."""
        return list(self._jobs.values())

    def get(self, job_id: str) -> Job | None:
        """The job with ``job_id``, or ``None``."""
        return self._jobs.get(job_id)

    async def start(self, params: Mapping[str, Any] | None = None) -> Job:
        """Build a job with the factory and start its ``fit()`` in the manager's group.

        The factory runs first, so its parameter errors come before the job limit: a
        request with bad parameters is told what is wrong even while the service is full.

        Raises:
            ServiceClosedError: The manager is not running or is shutting down.
            TooManyJobsError: ``max_running`` jobs are running.
            JobFactoryError: The factory returned no Trainer or did not attach the
                job's loggers.
            ValueError, TypeError: From the factory (bad parameters).
        """
        tg = self._tg
        if tg is None or self._closing:
            raise ServiceClosedError(
                "the job manager is not running (not entered yet, or shutting down); "
                "start jobs inside `async with manager:`"
            )
        stream = EventStream(
            buffer_size=self.buffer_size, events=self.stream_events, history=self.stream_history
        )
        ctx = JobContext(secrets.token_hex(6), dict(params or {}), stream)
        trainer = self.job_factory(ctx)
        if inspect.isawaitable(trainer):
            trainer = await trainer
        if not isinstance(trainer, Trainer):
            raise JobFactoryError(
                f"job_factory returned {type(trainer).__qualname__}; it must return a "
                "trainbus.Trainer"
            )
        attached = trainer.state.callbacks
        if not any(cb is ctx.stream for cb in attached) or not any(
            cb is ctx.metrics for cb in attached
        ):
            raise JobFactoryError(
                "the trainer built by job_factory lacks the job's loggers; build it with "
                "Trainer(..., loggers=[*ctx.loggers, ...])"
            )
        if self._closing:  # shutdown began while an async factory ran
            raise ServiceClosedError("the job manager is shutting down; no new jobs")
        # After the factory: a request with bad parameters gets their error (400) whether
        # or not the limit is reached; only a valid one is told to retry later (429).
        if self.max_running is not None and self.running >= self.max_running:
            raise TooManyJobsError(
                f"{self.running} jobs are running (max_running={self.max_running}); wait for "
                "one to finish or cancel one"
            )
        if self.watch_bus:
            stream.watch(trainer.engine)
        job = Job(ctx, trainer)
        self._jobs[job.id] = job
        self._forget_old()
        tg.start_soon(self._run, job, name=f"trainbus-job-{job.id}")
        return job

    def _forget_old(self) -> None:
        finished = [job for job in self._jobs.values() if job.done]
        for job in finished[: max(0, len(finished) - self.keep_finished)]:
            del self._jobs[job.id]

    async def _run(self, job: Job) -> None:
        try:
            with job._scope:
                job.status = JobStatus.RUNNING
                job.started_at = time.time()
                await job.trainer.fit()
                job.status = JobStatus.COMPLETED
        except Exception as exc:  # the job failed; the service goes on
            job.status = JobStatus.FAILED
            job.error = f"{type(exc).__qualname__}: {exc}"
        finally:
            if not job.status.final:  # cancelled: by cancel(), or the service stopping
                job.status = JobStatus.CANCELLED
            job.finished_at = time.time()
            job.stream.end()  # no-op when close ran; ends subscribers if fit never began
            job._done.set()
