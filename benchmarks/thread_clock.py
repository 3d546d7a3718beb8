"""The calling thread's clocks, for CPU accounting that does not depend on the machine's load.

``sample()`` on a thread, later ``delta(before, sample())`` on the same thread: wall time,
CPU time (``time.thread_time()``), run-queue wait (``/proc/thread-self/schedstat``: the time
the thread was runnable with no core free; NaN where the kernel does not say) and voluntary /
involuntary context switches (``getrusage(RUSAGE_THREAD)``; NaN off Linux).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

__all__ = ["delta", "runq_wait", "sample"]


def runq_wait() -> float:
    """Seconds the calling thread has waited for a core while runnable (``schedstat``; 0
    where the kernel does not say)."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def sample() -> dict[str, float]:
    """The calling thread's clocks: wall, CPU, run-queue wait (NaN where the kernel does not
    say), voluntary and involuntary context switches."""
    try:
        runq = int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        runq = math.nan
    vcsw = ivcsw = math.nan
    try:
        import resource

        usage = resource.getrusage(resource.RUSAGE_THREAD)
        vcsw, ivcsw = usage.ru_nvcsw, usage.ru_nivcsw
    except (ImportError, AttributeError, OSError):
        pass
    return {"wall": time.perf_counter(), "cpu": time.thread_time(), "runq": runq,
            "vcsw": vcsw, "ivcsw": ivcsw}


def delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """``b - a``, clock by clock (two samples of the same thread)."""
    return {k: b[k] - a[k] for k in a}
