"""Job states, the service's errors and its default limit of running jobs."""

from __future__ import annotations

import os
from enum import StrEnum

from trainbus.core.exceptions import JobFactoryError, ServiceClosedError, TooManyJobsError

__all__ = [
    "JobFactoryError",
    "JobStatus",
    "ServiceClosedError",
    "TooManyJobsError",
    "default_max_running",
]


def default_max_running() -> int:
    """Jobs a service runs at once by default: the CPU cores this process may use.

    Each job trains on a thread of its own; more training threads than cores only
    makes every job slower. Uses the process's CPU affinity where the OS has one.

    Example:
        >>> default_max_running()   # on a 2-core machine
        2
    """
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return max(1, len(affinity(0)))
    return max(1, os.cpu_count() or 1)


class JobStatus(StrEnum):
    """Where a job is in its life; the last three are final."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        """Whether the job has finished (completed, failed or cancelled)."""
        return self in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)
