"""Every thread trainbus starts is started here: a refusal is a :class:`ThreadStartError`.

When the operating system refuses a thread (``ulimit -u``, a container's pids limit,
``kernel.threads-max``), ``threading.Thread.start`` raises a bare
``RuntimeError("can't start new thread")``. :func:`start_thread` turns that into a
:class:`~trainbus.ThreadStartError` naming the thread, how many threads the process runs,
and the limits it can read; the caller stops what it had started and lets the error reach
the user's call (``Trainer(...)``, ``fit()``). Calls into anyio's worker threads go through
:func:`run_in_thread`, which does the same.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.to_thread

from trainbus.core.exceptions import ThreadStartError

__all__ = ["limits", "run_in_thread", "start_thread"]

T = TypeVar("T", bound=threading.Thread)
R = TypeVar("R")
#: The name anyio gives the worker threads of ``anyio.to_thread.run_sync``.
ANYIO_WORKER = "AnyIO worker thread"


def start_thread(
    thread: T,
    *,
    needed: str = "",
    error: type[ThreadStartError] = ThreadStartError,
    start: Callable[[], None] | None = None,
) -> T:
    """Start ``thread``, or raise ``error`` naming it and the limits here.

    Args:
        thread: A thread not started yet (its ``name`` is what the error names).
        needed: What the thread is for, a sentence for the message (``"It keeps the
            saver's writes off the training thread"``); empty: nothing added.
        error: The error to raise (:class:`ThreadStartError` or a subclass).
        start: What starts it, when not ``thread.start`` (a ``Thread`` subclass whose own
            ``start`` calls this with ``super().start``).

    Raises:
        ThreadStartError: The operating system refused the thread (``RuntimeError`` from
            ``Thread.start``); its ``__cause__`` is that error.

    Example:
        >>> start_thread(threading.Thread(target=print, name="trainbus-example"))
        <Thread(trainbus-example, started ...)>
    """
    try:
        (thread.start if start is None else start)()
    except RuntimeError as exc:  # "can't start new thread": the OS refused (EAGAIN)
        if str(exc).startswith("threads can only be started once"):
            raise
        raise _refused(thread.name, exc, needed, error) from exc
    return thread


async def run_in_thread(
    fn: Callable[..., R], *args: object, needed: str = "", abandon_on_cancel: bool = False
) -> R:
    """``anyio.to_thread.run_sync(fn, *args)``; anyio starts its worker threads on demand,
    and one the system refuses is a :class:`ThreadStartError` naming it and ``needed``."""
    try:
        return await anyio.to_thread.run_sync(fn, *args, abandon_on_cancel=abandon_on_cancel)
    except RuntimeError as exc:
        if "can't start new thread" not in str(exc):
            raise
        raise _refused(ANYIO_WORKER, exc, needed, ThreadStartError) from exc


def _refused(
    name: str, exc: RuntimeError, needed: str, error: type[ThreadStartError]
) -> ThreadStartError:
    why = f" {needed}." if needed else ""
    return error(
        f"the operating system refused to start thread {name!r} ({exc}).{why} "
        f"{threading.active_count()} threads already run in this process; the limits "
        f"here are {limits()}. Raise the limit (ulimit -u, the container's pids limit) "
        "or run fewer threads in this process",
        name,
    )


def limits() -> str:
    """The process's thread limits, as far as they can be read."""
    found = []
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
        found.append(f"ulimit -u (RLIMIT_NPROC) {'unlimited' if soft < 0 else soft}")
    except (ImportError, OSError, ValueError, AttributeError):
        pass
    for path in ("/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"):
        try:
            found.append(f"the container's pids limit ({path}) {Path(path).read_text().strip()}")
            break
        except OSError:
            continue
    try:
        found.append(
            f"kernel.threads-max {Path('/proc/sys/kernel/threads-max').read_text().strip()}"
        )
    except OSError:
        pass
    if os.name == "nt" or not found:
        found.append("the system's (unknown here)")
    return ", ".join(found)
