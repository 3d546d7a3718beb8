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

from trainbus.runtime.distributed import FAILED, PREEMPTED, SIGNUM, DistInfo, StopAgreement
from trainbus.runtime.peer_notices import PeerNotices
from trainbus.runtime.rank_times import RankFigures, RankTimes, RankTimesConfig

if TYPE_CHECKING:
    from trainbus.core.logger import Logger
    from trainbus.core.state import State
    from trainbus.runtime.preemption import Preemption

__all__ = ["RankStops"]


class RankStops:
    """``rank_stops(failed, last) -> stop here`` for the loop (training thread).

    Attributes:
        peer_failed: Whether another rank's failure stopped this one (the last agreement).
        stopped_at: The batch every rank stopped after, or ``None``.
    """

    def __init__(self, info: DistInfo, state: State, notices: Preemption) -> None:
        self.info = info
        self.state = state
        self.notices = notices
        #: The trainer's logger (set once it exists): rank zero logs the rank times with it.
        self.logger: Logger | None = None
        self.agreement: StopAgreement | None = None
        self.peers: PeerNotices | None = None
        #: Each rank's step time and data wait (``runtime/rank_times.py``), per fit.
        self.times: RankTimes | None = None
        self._times_config = RankTimesConfig.from_env()  # a bad variable fails here
        self.peer_failed = False
        self.stopped_at: int | None = None

    def open(self) -> None:
        """A new ``fit()`` (training thread, every rank: a collective): forget the last
        one's outcome and start this one's agreement and its channel for notices
        (:class:`~trainbus.runtime.peer_notices.PeerNotices`)."""
        self.peer_failed = False
        self.stopped_at = None
        self.agreement = StopAgreement.create(self.info)
        self.peers = PeerNotices.create(self.info, self._from_peer)
        self.notices.connect_peers(self.peers.send if self.peers is not None else None)
        self.times = RankTimes.create(self.info, self._times_config, self._report)

    def _from_peer(self, signum: int, seconds_left: float) -> None:
        self.notices.from_peer(self.state, signum, seconds_left)

    def close(self, *, ended: bool) -> None:
        """The ``fit()`` ended (training thread; ``ended``: without a raise): the
        agreement's group goes (:meth:`StopAgreement.close`), the rank times' and the
        channel for notices."""
        self.notices.stop_fixed(self.state)
        peers, self.peers = self.peers, None
        if peers is not None:
            peers.close()
        agreement, self.agreement = self.agreement, None
        if agreement is not None:
            agreement.close(ended=ended)
        times, self.times = self.times, None
        if times is not None:
            times.close(ended=ended)

    def timed(self, fetched: float) -> None:
        """A batch boundary for the rank times (training thread; before :meth:`__call__`)."""
        times = self.times
        if times is not None:
            times(fetched)

    def _report(self, figures: RankFigures) -> None:
        if self.logger is not None:  # rank zero's: its destinations get the figures
            self.logger.log_metrics(figures.metrics())

    def __call__(self, failed: bool, last: bool) -> bool:
        state = self.state
        notice = state.preemption
        flags = [
            int(failed or state.stop_requested or notice is not None),
            int(notice is not None),
            int(failed),
            (notice.signum or 0) if notice is not None else 0,
        ]
        agreement = self.agreement
        if agreement is None:  # no process group (the loop runs between open and close)
            return False
        agreed = agreement.step(flags, last=last)
        if agreed is None:
            if last:  # every rank ends here anyway: a notice now acts as in one process
                self.notices.stop_fixed(state)
            return False
        state.stop_training()
        self.stopped_at = int(state.timestamp.batch)
        if agreed[PREEMPTED] and not failed:
            self.notices.agreed(state, signum=agreed[SIGNUM])
        else:
            self.notices.stop_fixed(state)
        if agreed[FAILED] and not failed:
            self.peer_failed = True
        return True
