"""The preemption notice: why the run must stop and by when (``state.preemption``).

One notice per ``fit()``, whatever its source: a signal handled by
``Trainer(preemption=...)``, a call to ``trainer.preempt(reason)`` from any thread or task,
or another rank's notice under ``torchrun`` (``docs/preemption.md``). ``state.preemption``
is ``None`` until it comes; afterwards every handler sees the same
:class:`PreemptionNotice` at once (it is not part of the event's snapshot).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

__all__ = ["NoticeSource", "PreemptionNotice"]

#: Where a notice came from: a signal to this process, ``trainer.preempt()``, another rank.
NoticeSource = Literal["signal", "call", "peer"]


@dataclass(frozen=True, slots=True)
class PreemptionNotice:
    """The run has been told to stop: by ``deadline`` it must have checkpointed and closed.

    Attributes:
        reason: The signal's name (``"SIGTERM"``), the text given to
            ``trainer.preempt(reason)``, or, on the other ranks of a distributed run,
            ``"SIGTERM on another rank"`` / ``"preempted on another rank"``.
        deadline: A :func:`time.monotonic` value: when the process will be killed.
        source: ``"signal"``, ``"call"`` or ``"peer"`` (another rank's notice).
        signum: The signal's number for a signal (or a peer's signal), else ``None``.

    Example:
        >>> class Flush(trainbus.Callback):
        ...     async def preemption_notice(self, state, logger):
        ...         notice = state.preemption
        ...         with anyio.move_on_after(notice.time_left() / 2):
        ...             await self.client.flush()
    """

    reason: str
    deadline: float
    source: NoticeSource = "call"
    signum: int | None = None

    def time_left(self) -> float:
        """Seconds until :attr:`deadline` (``0.0`` once it has passed)."""
        return max(0.0, self.deadline - time.monotonic())
