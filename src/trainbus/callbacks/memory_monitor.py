"""``MemoryMonitor``: device memory on CUDA, process memory on the CPU."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from trainbus.callbacks._interval import Interval
from trainbus.core.callback import Callback, blocking
from trainbus.core.events import Event
from trainbus.core.time import Time

if TYPE_CHECKING:
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["MemoryMonitor"]

_GB = 1e9

#: ``torch.cuda.memory_stats`` keys and the names they are logged under (bytes -> GB).
_CUDA_KEYS = {
    "allocated_bytes.all.current": "memory/allocated_gb",
    "reserved_bytes.all.current": "memory/reserved_gb",
    "allocated_bytes.all.peak": "memory/peak_allocated_gb",
}


def _current_rss_reader() -> Callable[[], float] | None:
    """A function returning the resident set size in bytes, or None if unavailable."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        process = psutil.Process()
        return lambda: float(process.memory_info().rss)
    if sys.platform.startswith("linux"):
        import os

        page = os.sysconf("SC_PAGE_SIZE")

        def statm() -> float:
            with open("/proc/self/statm", "rb") as f:
                return float(int(f.read().split()[1]) * page)

        return statm
    return None


def _peak_rss() -> float | None:
    """The peak resident set size in bytes (``getrusage``), or None off Unix."""
    try:
        import resource
    except ImportError:
        return None
    peak = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


class MemoryMonitor(Callback):
    """Logs memory use every ``interval``.

    On CUDA it reads ``torch.cuda.memory_stats`` once per due batch (the allocator's
    counters; no device synchronisation) and logs ``memory/allocated_gb``,
    ``memory/reserved_gb``, ``memory/peak_allocated_gb`` and ``memory/alloc_retries``.
    On other devices it logs the process's resident set size as ``memory/rss_gb`` (from
    ``psutil`` when it is installed, else ``/proc/self/statm`` on Linux) and its peak as
    ``memory/peak_rss_gb`` (``resource.getrusage``, on Unix). GB are 10^9 bytes.

    The handlers are plain ``@blocking`` methods, so they run on the training thread and
    need no thread of their own: a batch that is not due costs the interval check (about
    a microsecond), a due one the reading (~10 us from psutil; ``memory_stats`` builds a
    dict of ~100 counters). A thread lane would cost a thread wake-up at every batch.

    Args:
        interval: How often to log: ``"10ba"``, ``"1ep"``, a :class:`~trainbus.Time`,
            or an int number of epochs.

    Example:
        >>> from trainbus.callbacks import MemoryMonitor
        >>> logs = InMemoryLogger()
        >>> Trainer(model, loader, "1ep", callbacks=[MemoryMonitor(interval="5ba")],
        ...         loggers=[logs]).fit_sync()
        >>> logs.most_recent_values["memory/rss_gb"]      # on the CPU
        0.61
    """

    def __init__(self, interval: Time[Any] | str | int = "10ba") -> None:
        self.interval = Interval(interval, name="MemoryMonitor(interval=...)")
        self._rss: Callable[[], float] | None = None

    @blocking
    def fit_start(self, state: State, logger: Logger) -> None:
        """Pick how memory is read for the run's device."""
        if state.device.type != "cuda":
            self._rss = _current_rss_reader()

    @blocking
    def batch_end(self, state: State, logger: Logger) -> None:
        """Log memory when the batch is due."""
        if self.interval.is_due(Event.BATCH_END, state):
            logger.log_metrics(self.read(state))

    @blocking
    def epoch_end(self, state: State, logger: Logger) -> None:
        """Log memory when the epoch is due (epoch intervals)."""
        if self.interval.is_due(Event.EPOCH_END, state):
            logger.log_metrics(self.read(state))

    def read(self, state: State) -> dict[str, float]:
        """The memory figures for ``state.device``, in GB (and a count of retries)."""
        if state.device.type == "cuda":
            stats = torch.cuda.memory_stats(state.device)
            metrics = {name: stats.get(key, 0) / _GB for key, name in _CUDA_KEYS.items()}
            metrics["memory/alloc_retries"] = float(stats.get("num_alloc_retries", 0))
            return metrics
        metrics = {}
        if self._rss is not None:
            metrics["memory/rss_gb"] = self._rss() / _GB
        peak = _peak_rss()
        if peak is not None:
            metrics["memory/peak_rss_gb"] = peak / _GB
        return metrics
