"""A lossy destination's records: a bounded queue that drops or merges instead of waiting.

A destination with a lossy ``backpressure`` (``docs/loggers.md``, "Falling behind") gets its
records here, not in its worker's queue: any thread offers one (:meth:`Mailbox.offer`); one
offered with no marker on its way puts a marker (a record-less ``LogItem``) in the worker's
queue, and the worker, at the marker, takes the waiting records (:meth:`Mailbox.takes`).

Counting (``queue.RecordCounts``): ``enq`` counts every record offered; the worker counts
``done`` as it takes, with the records dropped or merged meanwhile, so ``enq - done``
reaches 0 once everything is delivered. Full is ``depth >= limit``, as for ``block``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from trainbus.bus.members import Member
    from trainbus.bus.queue import RecordCounts
    from trainbus.core.backpressure import Backpressure
    from trainbus.core.logger import LogRecord

__all__ = ["FULL", "QUEUED", "WAKE", "Mailbox"]

#: :meth:`Mailbox.offer`'s answers: queued, give the worker a marker; queued (or dropped or
#: merged), a marker on its way; full (``coalesce``: wait for room).
WAKE: Final = 1
QUEUED: Final = 0
FULL: Final = -1


class Mailbox:
    """The waiting records of one lossy destination for one session (module docstring).

    Attributes:
        policy: The destination's :class:`~trainbus.Backpressure`.
        records_dropped: Whole records dropped this session.
        records_coalesced: Records merged into an earlier one this session.
        values_dropped: Per metric name, values lost this session (dropped or overwritten).

    Invariant: the waiting records and every count change only under ``_lock`` (the
    destination's ``RecordCounts.lock``).
    """

    __slots__ = ("_armed", "_counts", "_in_flight", "_lock", "_member", "_skipped", "_waiting",
                 "limit", "policy", "records_coalesced", "records_dropped", "values_dropped")

    def __init__(self, counts: RecordCounts, member: Member, policy: Backpressure) -> None:
        assert policy.lossy, "block needs no mailbox"
        assert policy.queue_size is not None
        self._counts = counts
        self._member = member
        self._lock = counts.lock
        self.policy = policy
        self.limit = policy.queue_size
        self._waiting: deque[LogRecord] = deque()
        self._armed = False  # a marker is queued on the lane and not yet taken to the end
        self._in_flight = 0
        self._skipped = 0  # dropped or merged since the worker's last take
        self.records_dropped = 0
        self.records_coalesced = 0
        self.values_dropped: Counter[str] = Counter()

    @property
    def depth(self) -> int:
        """Records waiting or being delivered now."""
        return len(self._waiting) + self._in_flight

    def offer(self, record: LogRecord, *, force: bool = False) -> int:
        """Queue ``record`` by the policy (any thread): :data:`WAKE`, :data:`QUEUED` or
        (``coalesce`` only, when it cannot merge; never with ``force``) :data:`FULL`."""
        with self._lock:
            if force or len(self._waiting) + self._in_flight < self.limit:
                self._waiting.append(record)
            elif self.policy.policy == "coalesce":
                if not self._merge(record):
                    return FULL
            else:
                if self.policy.policy == "latest":
                    self._replace(record)
                if len(self._waiting) + self._in_flight >= self.limit:
                    self._drop(self._waiting.popleft())
                self._waiting.append(record)
            self._counts.enq += 1
            if self._armed:
                return QUEUED
            self._armed = True
            return WAKE

    def takes(self, requeue: Callable[[], None]) -> Iterator[LogRecord]:
        """The worker, at a marker: the waiting records, at most ``limit + 1``; then, if more
        came, ``requeue()`` puts the marker at the back of the queue (the events never starve)."""
        for _ in range(self.limit + 1):
            with self._lock:
                skipped, self._skipped = self._skipped, 0
                record = self._waiting.popleft() if self._waiting else None
                if record is None:
                    self._in_flight = 0
                    self._armed = False  # the marker is spent
                else:
                    self._in_flight = 1
            if skipped:
                self._counts.count_done(skipped)
            if record is None:
                return
            yield record
        requeue()

    # -- the policies (under the lock; the mailbox is full) --------------------------------

    def _drop(self, record: LogRecord) -> None:
        self.records_dropped += 1
        self._member.records_dropped += 1
        self._skipped += 1
        self.values_dropped.update(record.metrics.keys())
        self._member.values_dropped += len(record.metrics)

    def _replace(self, record: LogRecord) -> None:
        """``latest``: drop each waiting record of its kind whose names all recur in ``record``."""
        names = record.metrics.keys()
        kept: deque[LogRecord] = deque()
        for old in self._waiting:
            if old.hyperparameters is record.hyperparameters and names >= old.metrics.keys():
                self._drop(old)
            else:
                kept.append(old)
        self._waiting = kept

    def _merge(self, record: LogRecord) -> bool:
        """Merge ``record`` into the newest waiting record of its step, level and kind."""
        if not self._waiting:
            return False
        newest = self._waiting[-1]
        if (newest.step, newest.level) != (record.step, record.level) or (
            newest.hyperparameters is not record.hyperparameters
        ):
            return False
        overwritten = [name for name in record.metrics if name in newest.metrics]
        self.values_dropped.update(overwritten)
        self._member.values_dropped += len(overwritten)
        self._waiting[-1] = dataclasses.replace(
            newest, metrics={**newest.metrics, **record.metrics}, wall_time=record.wall_time,
            _resolved=False,
        )
        self.records_coalesced += 1
        self._member.records_coalesced += 1
        self._skipped += 1
        return True

    def report(self, index: int) -> str | None:
        """What this session's policy lost, in words (``None`` when nothing)."""
        if not (self.records_dropped or self.records_coalesced or self.values_dropped):
            return None
        top = ", ".join(f"{name} {n:,}" for name, n in self.values_dropped.most_common(5))
        more = len(self.values_dropped) - 5
        names = f" ({top}{f', and {more} more names' if more > 0 else ''})" if top else ""
        return (
            f"{self._member.name} (callbacks[{index}]) fell behind: its {self.policy!r} dropped "
            f"{self.records_dropped:,} of {self._counts.enq:,} records and merged "
            f"{self.records_coalesced:,}, losing {self.values_dropped.total():,} values{names}. "
            "Raise its limit or make it faster to keep more; "
            "trainer.engine.statistics() counts records_dropped (docs/loggers.md, "
            "'Falling behind')"
        )
