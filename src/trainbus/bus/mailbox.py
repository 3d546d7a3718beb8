"""A lossy destination's records: a bounded queue that drops or merges instead of waiting.

A destination with a lossy ``backpressure`` (``core/backpressure.py``; ``docs/loggers.md``,
"Falling behind") gets its records here instead of in its worker's queue: any thread offers a
record (:meth:`Mailbox.offer`); the worker's queue gets one *marker* item (a ``LogItem``
without a record) when the mailbox goes from empty to not, and the runner, at the marker,
takes records (:meth:`Mailbox.take`) until there are none. So the queue holds at most one
marker per destination, however many records come, and memory is bounded by ``limit``.

Counting (``queue.RecordCounts``): ``enq`` counts every record offered, under its ``lock``
(this mailbox's lock); ``done`` stays the worker's: the records dropped or merged
since its last take are handed to it by :meth:`take` and it counts them done there. So
``enq - done`` still reaches 0 when everything is delivered (what
``wait_all(records=True)`` waits for), and no count ever goes back.

Fullness is ``len(waiting) + in_flight >= limit``: records logged and not yet delivered,
the one being delivered included (as for ``block``).
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from trainbus.bus.members import Member
    from trainbus.bus.queue import RecordCounts
    from trainbus.core.backpressure import Backpressure
    from trainbus.core.logger import LogRecord

__all__ = ["FULL", "QUEUED", "WAKE", "Mailbox"]


#: :meth:`Mailbox.offer`'s answers: queued and the runner must be given a marker; queued
#: (or dropped/merged) with a marker already on its way; full (``coalesce``: wait for room).
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
        self._skipped = 0  # dropped or merged since the runner's last take
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
            waiting = self._waiting
            if not force and len(waiting) + self._in_flight >= self.limit:
                if not self._make_room(record):
                    return FULL
            else:
                waiting.append(record)
            self._counts.enq += 1
            if self._armed:
                return QUEUED
            self._armed = True
            return WAKE

    def take(self) -> tuple[LogRecord | None, int]:
        """The runner: the oldest waiting record (``None`` when there is none: the marker
        is spent), and how many records were dropped or merged since its last take (to
        count done)."""
        with self._lock:
            skipped, self._skipped = self._skipped, 0
            if self._waiting:
                self._in_flight = 1
                return self._waiting.popleft(), skipped
            self._in_flight = 0
            self._armed = False
            return None, skipped

    def takes(self, requeue: Callable[[], None]) -> Iterator[LogRecord]:
        """The worker, at a marker: the waiting records, at most ``limit + 1`` takes; then,
        if more came meanwhile, ``requeue()`` puts the marker at the back of the queue, so
        that records logged without pause never starve the events. The records dropped or
        merged are counted done as they are taken."""
        for _ in range(self.limit + 1):
            record, skipped = self.take()
            if skipped:
                self._counts.count_done(skipped)
            if record is None:
                return
            yield record
        requeue()

    # -- the policies (under the lock; the box is full) ------------------------------------

    def _make_room(self, record: LogRecord) -> bool:
        """Apply the policy to a full box: true once ``record`` is in (or merged)."""
        policy = self.policy.policy
        if policy == "coalesce":
            return self._merge(record)
        if policy == "latest":
            self._replace(record)
        waiting = self._waiting
        if len(waiting) + self._in_flight >= self.limit:
            self._drop(waiting.popleft())
        waiting.append(record)
        return True

    def _drop(self, record: LogRecord) -> None:
        self._dropped_record()
        self._dropped_values(record.metrics.keys())

    def _dropped_record(self) -> None:
        self.records_dropped += 1
        self._skipped += 1
        self._member.records_dropped += 1

    def _dropped_values(self, names: Iterable[str]) -> None:
        before = self.values_dropped.total()
        self.values_dropped.update(names)
        self._member.values_dropped += self.values_dropped.total() - before

    def _replace(self, record: LogRecord) -> None:
        """Drop every waiting record of ``record``'s kind whose names all come again in
        ``record``: each of its values has a newer one waiting (per name, the latest
        wins), so only older values are lost."""
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
        if (
            newest.step != record.step
            or newest.level != record.level
            or newest.hyperparameters is not record.hyperparameters
        ):
            return False
        self._dropped_values([name for name in record.metrics if name in newest.metrics])
        merged = dataclasses.replace(
            newest, metrics={**newest.metrics, **record.metrics}, wall_time=record.wall_time,
            _resolved=False,
        )
        self._waiting[-1] = merged
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
