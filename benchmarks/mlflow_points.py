"""What bench_mlflow.py's scenarios share, in every venv (stdlib only).

The 10 values logged per batch, the marks taken on the training thread at the end of
each batch (wall clock, this thread's CPU time, the process's CPU time, and another
thread's CPU time, e.g. the event loop's), and the wait until a run's points are
readable in the server's sqlite store.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable

__all__ = ["KEYS", "Meter", "callgrind_toggle", "values", "wait_readable"]

KEYS = [f"m{i}" for i in range(10)]


def values(step: int) -> dict[str, float]:
    """The 10 metrics of batch ``step``."""
    return {key: 0.5 + i + step * 1e-3 for i, key in enumerate(KEYS)}


class Meter:
    """Marks at the end of batches 1 and N on the training thread; per-batch figures.

    ``other`` is the CPU clock of a second thread to watch (the event loop), if any.
    ``instrument=(a, b)``: call ``toggle(True)`` at the end of batch ``a`` and
    ``toggle(False)`` at the end of batch ``b``; by default :func:`callgrind_toggle` (under
    ``valgrind --tool=callgrind --instr-atstart=no``: counts of batches ``a+1..b`` only).
    """

    def __init__(self, instrument: tuple[int, int] | None = None,
                 toggle: Callable[[bool], None] | None = None) -> None:
        self.first: tuple[float, ...] | None = None
        self.last: tuple[float, ...] = ()
        self.batches = 0
        self.other: int | None = None
        self.instrument = instrument
        self.toggle = toggle or callgrind_toggle

    def watch_this_thread(self) -> None:
        """Watch the calling thread's CPU time too (call it on the event loop)."""
        self.other = time.pthread_getcpuclockid(threading.get_ident())

    def mark(self) -> None:
        """Call at the end of every batch, on the training thread."""
        other = time.clock_gettime(self.other) if self.other is not None else 0.0
        now = (time.perf_counter(), time.thread_time(), time.process_time(), other)
        if self.first is None:
            self.first = now
        self.last = now
        self.batches += 1
        if self.instrument is not None and self.batches in self.instrument:
            self.toggle(self.batches == self.instrument[0])

    def per_batch(self) -> dict[str, float]:
        """ms per batch from the end of batch 1 to the end of the last one.

        ``wall``, ``train_cpu`` (the training thread), ``proc_cpu`` (the process, every
        thread), ``loop_cpu`` (the watched thread; 0 if none); ``t_last`` is the
        ``perf_counter`` of the last mark (system-wide on Linux: CLOCK_MONOTONIC).
        """
        assert self.first is not None
        assert self.batches > 1
        n = self.batches - 1
        wall, train, proc, other = ((b - a) * 1e3 / n for a, b in zip(self.first, self.last, strict=True))
        return {"wall": wall, "train_cpu": train, "proc_cpu": proc, "loop_cpu": other,
                "t_last": self.last[0]}


def callgrind_toggle(on: bool) -> None:
    """Turn callgrind's instrumentation of this process on or off."""
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())],
                   check=True, capture_output=True, timeout=600)


def wait_readable(db: str, run_id: str, n_points: int, timeout: float = 300.0) -> float:
    """Poll the server's sqlite store until the run has ``n_points`` points of ``KEYS``;
    return that moment (``perf_counter``).

    A read of the store the server commits to (one cheap local query every 2 ms), not
    an API call: polling through ``get_metric_history`` costs ~30 ms per key on a loaded
    machine, which would blur the figure it measures.
    """
    marks = ",".join("?" * len(KEYS))
    query = f"SELECT COUNT(*) FROM metrics WHERE run_uuid = ? AND key IN ({marks})"
    deadline = time.perf_counter() + timeout
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        while con.execute(query, (run_id, *KEYS)).fetchone()[0] < n_points:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"run {run_id}: not {n_points} points after {timeout}s")
            time.sleep(0.002)
    return time.perf_counter()
