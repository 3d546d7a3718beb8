"""Every rank stops after the same batch: the Trainer's side of the stop agreement.

The loop asks :class:`RankStops` at each batch boundary of a distributed run whether to stop
(``TrainingLoop.rank_stops``). It contributes this rank's flags to
:class:`~trainbus.runtime.distributed.StopAgreement` (a stop request, a preemption notice, a
held failure) and acts on what every rank agreed: a stop request on every rank; for a
preemption, the notice on the ranks that had none and a checkpoint request to every saver
(``FIT_END`` writes it: the batch every rank stopped at); for a failure elsewhere, a note
that :meth:`Trainer.fit` turns into an error naming it. See ``docs/preemption.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainbus.runtime.distributed import FAILED, PREEMPTED, SIGNUM, StopAgreement

if TYPE_CHECKING:
    from trainbus.core.state import State
    from trainbus.runtime.preemption import Preemption

__all__ = ["RankStops"]


class RankStops:
    """``rank_stops(failed, last) -> stop here`` for the loop (training thread).

    Attributes:
        peer_failed: Whether another rank's failure stopped this one (the last agreement).
        stopped_at: The batch every rank stopped after, or ``None``.
    """

    def __init__(self, agreement: StopAgreement, state: State, notices: Preemption) -> None:
        self.agreement = agreement
        self.state = state
        self.notices = notices
        self.peer_failed = False
        self.stopped_at: int | None = None

    def reset(self) -> None:
        """A new ``fit()``: forget the last one's outcome."""
        self.peer_failed = False
        self.stopped_at = None

    def __call__(self, failed: bool, last: bool) -> bool:
        state = self.state
        notice = state.preemption
        flags = [
            int(failed or state.stop_requested or notice is not None),
            int(notice is not None),
            int(failed),
            (notice.signum or 0) if notice is not None else 0,
        ]
        agreed = self.agreement.step(flags, last=last)
        if agreed is None:
            return False
        state.stop_training()
        self.stopped_at = int(state.timestamp.batch)
        if agreed[PREEMPTED] and not failed:
            self.notices.agreed(state, signum=agreed[SIGNUM])
        if agreed[FAILED] and not failed:
            self.peer_failed = True
        return True
