"""What a stopped run says: the one line a preempted ``fit()`` ends with on stderr, and the
stop report it leaves for the job script.

``runtime/`` sits below ``callbacks/`` and ``loggers/``: it asks for what it reports through
two small protocols, the saver's list of written checkpoints and a destination's account of
what it still holds (``BatchingDestination.undelivered``). ``docs/preemption.md``, "The last
line", shows the line; "Telling a preemption from a crash" the report: with
``TRAINBUS_STOP_REPORT=PATH`` in the environment, a rank that stopped for a preemption writes
PATH (``{rank}`` in it is replaced by the rank), a small JSON object, as it ends, also when
the last bound ends it (:func:`write_report`). A launcher's exit status cannot say what
happened (torchrun exits 1 once a worker exited non-zero, or when it was signalled itself):
the file can.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from trainbus.core.notice import PreemptionNotice
    from trainbus.core.state import State

__all__ = [
    "REPORT_ENV",
    "KeepsCheckpoints",
    "ReportsUndelivered",
    "newest_checkpoint",
    "say",
    "stop_summary",
    "write_report",
]

#: The variable that names the stop report's file (unset: no file).
REPORT_ENV = "TRAINBUS_STOP_REPORT"


@runtime_checkable
class KeepsCheckpoints(Protocol):
    """A saver's list of the checkpoints it wrote (``CheckpointSaver.saved_checkpoints``)."""

    @property
    def saved_checkpoints(self) -> list[tuple[Any, list[Path]]]:
        """``(timestamp, [paths])`` of each checkpoint complete on disk, oldest first."""


@runtime_checkable
class ReportsUndelivered(Protocol):
    """A destination that can say what it still holds (``BatchingDestination.undelivered``)."""

    def undelivered(self) -> str | None:
        """What is undelivered, in a few words, or ``None``."""


def newest_checkpoint(state: State) -> list[Path]:
    """The newest checkpoint each saver among ``state.callbacks`` wrote (complete on disk)."""
    return [
        paths[0]
        for cb in state.callbacks
        if isinstance(cb, KeepsCheckpoints)
        for _, paths in cb.saved_checkpoints[-1:]
        if paths
    ]


def write_report(
    notice: PreemptionNotice, state: State, exit_code: int, environ: dict[str, str] | None = None
) -> Path | None:
    """Write the stop report to ``$TRAINBUS_STOP_REPORT`` (``{rank}`` replaced), if set.

    One JSON object: ``{"preempted": true, "reason", "source", "signal", "rank",
    "world_size", "batch", "checkpoint", "exit_code", "unix_time"}``; ``checkpoint`` is the
    newest this rank's saver wrote (``null``: none, or not on this rank). Written to a
    temporary file, then renamed: a reader sees all of it or none. A failure to write is
    reported on stderr, never raised (the stop goes on). Returns the file, or ``None``.

    Example:
        >>> # TRAINBUS_STOP_REPORT=/shared/job-42/stop.json torchrun ... ; then in the script:
        >>> # [ -f /shared/job-42/stop.json ] && echo preempted
    """
    env = os.environ if environ is None else environ
    raw = env.get(REPORT_ENV, "").strip()
    if not raw:
        return None
    path = Path(raw.replace("{rank}", str(state.rank)))
    written = newest_checkpoint(state)
    report = {
        "preempted": True,
        "reason": notice.reason,
        "source": notice.source,
        "signal": notice.signum,
        "rank": state.rank,
        "world_size": state.world_size,
        "batch": int(state.timestamp.batch),
        "checkpoint": str(written[0]) if written else None,
        "exit_code": exit_code,
        "unix_time": time.time(),
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(report) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        say(f"trainbus: the stop report could not be written to {str(path)!r} ({exc}); "
            f"set {REPORT_ENV} to a writable path")  # fmt: skip
        return None
    return path


def stop_summary(notice: PreemptionNotice, state: State) -> str:
    """The line a preempted ``fit()`` ends with on stderr: where it stopped, its checkpoint,
    and what each destination left for the resumed run (after every callback closed)."""
    batch = int(state.timestamp.batch)
    written = newest_checkpoint(state)
    savers = any(isinstance(cb, KeepsCheckpoints) for cb in state.callbacks)
    checkpoint = (
        "checkpoint " + ", ".join(repr(str(p)) for p in written) if written
        else "no checkpoint written" if savers
        else "no checkpoint written (no CheckpointSaver)"
    )
    reporters = [cb for cb in state.callbacks if isinstance(cb, ReportsUndelivered)]
    left = [(type(cb).__name__, cb.undelivered()) for cb in reporters]
    parts = [f"{name}: {what}" for name, what in left if what is not None]
    tail = (
        "; left undelivered: " + "; ".join(parts) if parts
        else f"; {', '.join(name for name, _ in left)}: all delivered" if left
        else ""
    )  # fmt: skip
    return f"trainbus: {notice.reason}: stopped after batch {batch}; {checkpoint}{tail}"


def say(line: str) -> None:
    """Write ``line`` to stderr at once (a stop's lines; a closed stderr fails nothing)."""
    with contextlib.suppress(Exception):  # a closed stderr does not fail the stop
        print(line, file=sys.stderr, flush=True)
