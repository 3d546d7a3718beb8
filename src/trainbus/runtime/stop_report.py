"""What a stopped run says: the one line a preempted ``fit()`` ends with on stderr.

``runtime/`` sits below ``callbacks/`` and ``loggers/``: it asks for what it reports through
two small protocols, the saver's list of written checkpoints and a destination's account of
what it still holds (``BatchingDestination.undelivered``). ``docs/preemption.md``, "The last
line", shows the line.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from trainbus.core.notice import PreemptionNotice
    from trainbus.core.state import State

__all__ = ["KeepsCheckpoints", "ReportsUndelivered", "say", "stop_summary"]


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


def stop_summary(notice: PreemptionNotice, state: State) -> str:
    """The line a preempted ``fit()`` ends with on stderr: where it stopped, its checkpoint,
    and what each destination left for the resumed run (after every callback closed)."""
    batch = int(state.timestamp.batch)
    written = [
        paths[0]
        for cb in state.callbacks
        if isinstance(cb, KeepsCheckpoints)
        for _, paths in cb.saved_checkpoints[-1:]
        if paths
    ]
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
