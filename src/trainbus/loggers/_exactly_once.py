"""Which destinations of a run deliver each point exactly once across a crash and a resume.

A destination that can make a killed-and-resumed run deliver every point once (the
uploader's journal, ``docs/crash-consistency.md``) needs to know, before the run logs
anything and before a checkpoint is restored into it, whether the run saves checkpoints
(without one there is nothing to resume from) and whether it was resumed. The Trainer
calls :func:`plan_exactly_once` once, in its constructor, between reading the checkpoint
and ``INIT``. Each destination that takes part defines::

    def _plan_exactly_once(self, *, checkpointed: bool, resumed: bool) -> str | None

which switches its crash-consistent path on where it can (an uploader's ``journal=None``,
the default, becomes a journal when it has a ``spool_dir`` and the run a
``CheckpointSaver``) and returns why the run cannot be exactly once, or ``None``. The
reasons are warned about once per process (:class:`~trainbus.loggers.MetricsUploadWarning`)
when the run resumes from a checkpoint: the case where points are then sent twice or lost.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

from trainbus.loggers._delivery import MetricsUploadWarning

__all__ = ["plan_exactly_once"]

_warned: set[str] = set()


def plan_exactly_once(callbacks: Iterable[Any], *, resumed: bool) -> list[str]:
    """Let each destination choose its crash-consistent path; warn once about those that
    cannot be exactly once in a resumed run. Returns the reasons (empty when all can)."""
    from trainbus.callbacks.checkpoint_saver import CheckpointSaver

    callbacks = list(callbacks)
    checkpointed = any(isinstance(cb, CheckpointSaver) for cb in callbacks)
    reasons = []
    for cb in callbacks:
        plan = getattr(cb, "_plan_exactly_once", None)
        if callable(plan):
            reason = plan(checkpointed=checkpointed, resumed=resumed)
            if reason:
                reasons.append(reason)
    for reason in reasons:
        if resumed and reason not in _warned:
            _warned.add(reason)
            warnings.warn(
                f"{reason}; this run resumes from a checkpoint, so the points logged "
                "between that checkpoint and the interruption may reach it twice (or, "
                "those not delivered then, not at all). See docs/crash-consistency.md",
                MetricsUploadWarning,
                stacklevel=4,
            )
    return reasons
