"""The delivery machinery that HTTP destinations share: batches, spool, retries, close.

:class:`BatchingDestination` is the base of :class:`~trainbus.loggers.HTTPMetricsUploader`
and :class:`~trainbus.loggers.MLflowLogger`. A subclass says what an item is (``_items``),
how many items fit in one request (``_cut``), how to open the run (``_open``) and how to
send one batch (``_attempt``); everything else is here.

How it runs: a subclass's ``log_record`` hands a record's items to ``_add`` on the loop
(``async def``: a loop lane) or puts them in ``self._inbox`` from its lane thread (plain
``def``, cheaper per record; ``_inbox.py``). ``_add`` buffers items and seals a batch per
request's worth (no I/O). ``background`` runs the *stager* (seals the buffer every
``flush_interval``, spools sealed batches in a worker thread, times ``close``) and the
*sender* (sends the oldest batch until a 2xx or a refusal; with a spool, only batches on
disk). ``close`` seals the rest, waits up to ``close_timeout`` and reports. Buffer, outbox
and signal are touched on the loop only (no locks); the spool's ``fsync`` runs in a thread.

Whether the run completed: an ``async def fit_end`` notes that ``FIT_END`` came. A
``close`` without it ends a failed or cancelled run; once every batch is in the spool, it
waits only until the next failed attempt (the next run resends the spool), not ``close_timeout``.
"""

from __future__ import annotations

import itertools
import math
import os
import uuid
import warnings
from collections import deque
from typing import TYPE_CHECKING, Any

import anyio

from trainbus.core.destination import LoggerDestination
from trainbus.core.logger import LogRecord
from trainbus.loggers._delivery import (
    MetricsUploadStatistics,
    MetricsUploadWarning,
    Reply,
    Signal,
    Unreported,
    checked_options,
    require_httpx,
    undelivered_message,
)
from trainbus.loggers._inbox import Inbox
from trainbus.loggers._journal import Journal
from trainbus.loggers._retry import Retrier
from trainbus.loggers._spool import Batch, Spool

if TYPE_CHECKING:
    from pathlib import Path

    import httpx

    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["BatchingDestination"]


class BatchingDestination(LoggerDestination):
    """Base of the destinations that deliver batches over HTTP (see the module docstring).

    They take only ``Backpressure.block(...)`` (``docs/loggers.md``, "Falling behind"):
    they promise every point, and their ``log_record`` only buffers.

    Args:
        target: What ``close``'s warnings name as the destination (a URL).
        batch_size: Items per request at most.
        flush_interval: Seconds; the partial buffer is sealed and sent this often.
        spool_dir: A directory where each batch is written before its first attempt.
        journal: Journal every item in ``spool_dir`` before it counts as logged (``True``),
            never (``False``), or when the Trainer says the run saves checkpoints
            (``None``; ``_plan_exactly_once``).
        timeout: Seconds one attempt may take as a whole (redirects and body read too).
        close_timeout: Seconds ``close`` waits for undelivered batches.
        backoff: Seconds before the first retry; doubles per retry of a batch.
        max_backoff: Seconds; the cap of the doubling.
    """

    _refuses_lossy = (
        "it promises every point exactly once (retries, spool, journal), which a policy "
        "that drops would break; its log_record only buffers, so it rarely falls behind"
    )

    def __init__(
        self,
        target: str,
        *,
        batch_size: int,
        flush_interval: float,
        spool_dir: str | os.PathLike[str] | None,
        journal: bool | None,
        timeout: float,
        close_timeout: float,
        backoff: float,
        max_backoff: float,
    ) -> None:
        self._target = target
        options = checked_options(
            batch_size, flush_interval, timeout, close_timeout, backoff, max_backoff
        )
        self.batch_size, self.flush_interval, self.timeout = options[:3]
        self.close_timeout, self.backoff, self.max_backoff = options[3:]
        self._spool = Spool(spool_dir) if spool_dir is not None else None
        self._seq = itertools.count()
        self._buffer: list[Any] = []
        self._inbox = Inbox(self.batch_size)  # items from a lane thread
        self._outbox: deque[Batch] = deque()  # sealed, undelivered, oldest first
        self._to_spool: deque[Batch] = deque()  # sealed, not yet on disk (spool only)
        self._keys: set[str] = set()
        self._signal: Signal | None = None
        self._close_done: anyio.Event | None = None  # set when close may report
        self._close_deadline = math.inf
        self._run: str | None = None  # what batches sealed by this run carry as ``run``
        self._completed = False  # FIT_END came in this cycle
        self._failed_in_close = False  # an attempt failed since close began
        self._gave_up = False  # close stopped waiting early: failed run, all spooled
        self._client: httpx.AsyncClient | None = None
        self._fatal: Exception | None = None  # why the run could not be opened
        self._retry = Retrier(self.backoff, self.max_backoff, self.timeout, self._attempt_failed)
        self.points_sent = self.batches_sent = self.spooled_batches = 0
        self._rejected = self._recovered = self._skipped = 0
        self._unreported = Unreported()
        # Built once, here: an SSL context costs ~20 ms of GIL-holding work, which every
        # AsyncClient would otherwise repeat at the start of each fit, beside training.
        self._ssl_context = require_httpx(type(self).__name__).create_ssl_context()
        self._journal: Journal | None = None
        self._journal_choice = journal
        if journal:
            self._use_journal()

    # -- what subclasses define ----------------------------------------------------------------

    def _items(self, record: LogRecord) -> list[Any]:
        """The items ``record`` adds to the buffer (count skipped values in ``_skipped``)."""
        raise NotImplementedError

    def _cut(self, buffer: list[Any]) -> int:
        """How many items from the front of ``buffer`` form the next batch (at least 1)."""
        return min(len(buffer), self.batch_size)

    async def _open(self, client: httpx.AsyncClient, state: State) -> str:
        """Prepare the run (may send requests); return the ``run`` new batches carry.

        Raises ``httpx.TransportError``/:class:`RequestTimeout` (retried) or returns.
        """
        raise NotImplementedError

    async def _attempt(self, client: httpx.AsyncClient, batch: Batch) -> Reply:
        """Send ``batch`` once."""
        raise NotImplementedError

    async def _finish(self, client: httpx.AsyncClient, completed: bool) -> None:
        """After delivery at close (e.g. mark the run finished); by default nothing."""

    def _spoolable(self, batch: Batch) -> bool:
        """Whether ``batch`` goes to the spool (MLflow's parameters skip a journal)."""
        return True

    # -- what training calls -----------------------------------------------------------------

    def _add(self, items: list[Any], params: bool) -> None:
        """Buffer ``items`` and seal full batches (loop only); ``params`` go in batches alone."""
        if not items:
            return
        if params:
            self._seal(partial=True)
        self._buffer.extend(items)
        if params or len(self._buffer) >= self.batch_size:
            self._seal(partial=params)

    def _take(self) -> None:
        """Buffer what a lane thread put in ``_inbox`` (event loop only)."""
        for items, params in self._inbox.take():
            self._add(items, params)

    async def fit_end(self, state: State, logger: Logger) -> None:
        """Note that the run completed (a ``close`` without it ends a failed run)."""
        self._completed = True

    async def background(self, state: State, logger: Logger) -> None:
        """Resend what an earlier run left in the spool, open the run, stage and send."""
        httpx = require_httpx(type(self).__name__)
        self._completed = False
        signal = self._signal = Signal()
        self._inbox.attach(self._take)
        try:
            if self._spool is not None:
                await self._recover(self._spool)
            client = self._client = httpx.AsyncClient(**self._client_options())
            async with client, anyio.create_task_group() as tg:
                tg.start_soon(self._opener, client, state, signal, tg.cancel_scope)
                tg.start_soon(self._stager, signal)
                await self._sender(client, signal)
            if self._fatal is not None:  # the run could not be opened: fail fit() with it
                fatal, self._fatal = self._fatal, None
                raise fatal
        finally:
            self._signal = self._client = None
            self._inbox.detach()
            if self._close_done is not None:  # a close waiting for this task stops waiting
                self._close_done.set()
                self._close_done = None
                self._close_deadline = math.inf

    def _client_options(self) -> dict[str, Any]:
        return {"timeout": self.timeout, "follow_redirects": False, "verify": self._ssl_context}

    def _why_not_exactly_once(self) -> str:
        """Why this destination, without a journal, cannot hold each item once (its words)."""
        raise NotImplementedError

    # -- exactly once (docs/crash-consistency.md) ------------------------------------------

    @property
    def journal(self) -> bool:
        """Whether items go through the write-ahead journal (see the ``journal`` argument)."""
        return self._journal is not None

    def _use_journal(self) -> None:
        spool = self.spool_dir
        assert spool is not None
        if self._journal is None:
            self._journal = self._spool = Journal(spool, batch_size=self.batch_size)

    def _plan_exactly_once(self, *, checkpointed: bool, resumed: bool) -> str | None:
        """The Trainer's question (``loggers/_exactly_once.py``): journal by default when
        the run saves checkpoints and there is a spool; why not exactly once otherwise."""
        if self._journal_choice is None and checkpointed and self.spool_dir is not None:
            self._use_journal()
        if self._journal is not None:
            return None
        return self._why_not_exactly_once()

    async def close(self, state: State, logger: Logger) -> None:
        """Seal the rest, wait up to ``close_timeout`` for delivery, report what is left.

        Emits a :class:`MetricsUploadWarning` when batches were refused, or when some
        are still undelivered (naming the spool that keeps them, or the points lost).
        """
        self._take()
        self._seal(partial=True)
        signal, reason = self._signal, f"within close_timeout={self.close_timeout:g}s"
        deadline = anyio.current_time() + self.close_timeout
        self._gave_up = False
        if signal is not None and (self._outbox or self._to_spool):
            # The stager enforces the deadline and sets ``done`` (see _check_close).
            done = self._close_done = anyio.Event()
            self._failed_in_close = False
            self._close_deadline = deadline
            self._retry.wake()  # retry now: the server may be back
            signal.notify()
            await done.wait()
            if self._gave_up:
                reason = "before close returned (the run did not complete; they are spooled)"
        client = self._client
        if client is not None and type(self)._finish is not BatchingDestination._finish:
            try:
                with anyio.move_on_after(max(0.0, deadline - anyio.current_time())) as scope:
                    await self._finish(client, self._completed)
                if scope.cancelled_caught:
                    self._unreported.finish_error = (
                        f"no time left within close_timeout={self.close_timeout:g}s"
                    )
            except Exception as exc:  # reported below, like undelivered batches
                self._unreported.finish_error = f"{type(exc).__name__}: {exc}"
        self._report(reason)

    # -- observability -------------------------------------------------------------------------

    def statistics(self) -> MetricsUploadStatistics:
        """Counters of what was sent, retried, spooled and refused (safe from any thread)."""
        outbox = list(self._outbox)
        pending = sum(len(b.points) for b in outbox) + len(self._buffer) + self._inbox.pending
        return MetricsUploadStatistics(
            points_sent=self.points_sent,
            batches_sent=self.batches_sent,
            retries=self.retries,
            spooled_batches=self.spooled_batches,
            pending_batches=len(outbox),
            pending_points=pending,
            rejected_batches=self._rejected,
            recovered_batches=self._recovered,
            skipped_values=self._skipped,
            last_error=self._retry.last_error,
        )

    def undelivered(self) -> str | None:
        """What this destination holds undelivered, in a few words (``None``: nothing),
        e.g. ``"12 points in 3 batches, in spool_dir='/s' for the next run"``.

        After ``close`` this is what the resumed run inherits (or what is lost); the
        preemption's closing line on stderr quotes it. Safe from any thread.
        """
        outbox = list(self._outbox)
        points = sum(len(b.points) for b in outbox) + len(self._buffer)
        if not points:
            return None
        spool = self.spool_dir
        lost = sum(len(b.points) for b in outbox if not b.spooled) + len(self._buffer)
        if getattr(self._spool, "journaled", False):  # a journal holds every point
            lost = 0
        where = f"in {len(outbox)} batches" if outbox else "not yet batched"
        if spool is None or lost == points:
            return f"{points} points {where}, in memory only (lost at exit)"
        kept = f"in spool_dir={str(spool)!r} for the next run"
        if lost:
            return f"{points} points {where}, {points - lost} {kept}, {lost} in memory only"
        return f"{points} points {where}, {kept}"

    @property
    def retries(self) -> int:
        """Attempts after a failed one (all requests together)."""
        return self._retry.retries

    @property
    def spool_dir(self) -> Path | None:
        """The spool directory, or ``None``."""
        return self._spool.directory if self._spool is not None else None

    # -- staging -------------------------------------------------------------------------------

    def _seal(self, *, partial: bool) -> None:
        buffer = self._buffer
        sealed = False
        while len(buffer) >= self.batch_size or (partial and buffer):
            size = max(1, self._cut(buffer))
            batch = Batch(key=str(uuid.uuid4()), points=buffer[:size], seq=next(self._seq))
            del buffer[:size]
            batch.run = self._run
            self._outbox.append(batch)
            self._keys.add(batch.key)
            if self._spool is not None and self._spoolable(batch):
                self._to_spool.append(batch)
            elif self._spool is not None:
                batch.unspoolable = True  # sent from memory (see _spoolable)
            sealed = True
        if sealed and self._signal is not None:
            self._signal.notify()

    async def _opener(
        self, client: httpx.AsyncClient, state: State, signal: Signal, scope: anyio.CancelScope
    ) -> None:
        """Open the run (retrying like a batch), then give sealed batches their ``run``.

        A refusal ends ``background`` (through ``scope``), which raises it unwrapped.
        """
        try:
            run = await self._retry.until_done(lambda: self._open(client, state))
        except Exception as exc:
            self._fatal = exc
            self._retry.last_error = f"opening the run: {exc}"
            scope.cancel()
            return
        self._run = run
        for batch in itertools.chain(self._outbox, self._to_spool):
            if batch.run is None:
                batch.run = run
        signal.notify()

    def _attempt_failed(self) -> None:
        """After a failed attempt: while ``close`` waits, it may stop waiting."""
        if self._close_done is not None:
            self._failed_in_close = True
            self._check_close(anyio.current_time())

    async def _recover(self, spool: Spool) -> None:
        try:
            batches, corrupt = await anyio.to_thread.run_sync(spool.load)
        except OSError as exc:  # an unreadable spool must not stop training either
            self._unreported.spool_failures += 1
            self._retry.last_error = self._unreported.spool_error = f"reading the spool: {exc}"
            return
        fresh = [b for b in batches if b.key not in self._keys]
        for batch in reversed(fresh):  # older than anything sealed by this run
            self._outbox.appendleft(batch)
            self._keys.add(batch.key)
        self._recovered += len(fresh)
        self.spooled_batches += len(fresh)
        if corrupt:
            self._retry.last_error = f"unreadable spool files renamed: {[str(p) for p in corrupt]}"

    async def _stager(self, signal: Signal) -> None:
        """Seal the buffer every ``flush_interval``, spool sealed batches, time ``close``."""
        next_flush = anyio.current_time() + self.flush_interval
        while True:
            now = anyio.current_time()
            if now >= next_flush:
                self._take()
                self._seal(partial=True)
                next_flush = now + self.flush_interval
            batch = self._to_spool[0] if self._to_spool else None
            if self._spool is not None and batch is not None and batch.run is not None:
                try:
                    await anyio.to_thread.run_sync(self._spool.write, batch)
                except OSError as exc:  # a full disk must not stop training: send from memory
                    batch.unspoolable = True
                    self._unreported.spool_failures += 1
                    error = f"writing the spool: {exc}"
                    self._retry.last_error = self._unreported.spool_error = error
                else:
                    self.spooled_batches += 1
                self._to_spool.popleft()  # only now: a cancelled write is redone next time
                signal.notify()
                continue
            self._check_close(now)
            with anyio.move_on_after(min(next_flush, self._close_deadline) - now):
                await signal.wait()

    def _check_close(self, now: float) -> None:
        """Let a waiting ``close`` report: all delivered; or its deadline passed, or the
        run failed and an attempt failed since close began, and all that is left is on
        disk (or there is no spool, for the deadline)."""
        done = self._close_done
        if done is None or (self._to_spool and self._run is not None):
            return  # spooling (quick) comes first; without a run there is nothing to spool
        given_up = (
            not self._completed
            and self._failed_in_close
            and self._spool is not None
            and all(b.spooled for b in self._outbox)
        )
        if not self._outbox or now >= self._close_deadline or given_up:
            self._gave_up = given_up and bool(self._outbox)
            self._close_done = None
            self._close_deadline = math.inf
            done.set()

    # -- sending -------------------------------------------------------------------------------

    async def _sender(self, client: httpx.AsyncClient, signal: Signal) -> None:
        while True:
            batch = self._outbox[0] if self._outbox else None
            if (
                batch is None
                or batch.run is None
                or (self._spool and not (batch.spooled or batch.unspoolable))
            ):
                await signal.wait()
                continue
            reply = await self._deliver(client, batch)
            spool = self._spool
            if reply is None:
                if spool is not None and batch.spooled:
                    await anyio.to_thread.run_sync(spool.remove, batch)
                    self.spooled_batches -= 1
                self.points_sent += len(batch.points)
                self.batches_sent += 1
            else:
                if spool is not None and batch.spooled:
                    await anyio.to_thread.run_sync(spool.set_aside, batch)
                    self.spooled_batches -= 1
                self._rejected += 1
                self._unreported.rejected_batches += 1
                self._unreported.rejected_points += len(batch.points)
                self._unreported.statuses.add(reply.status)
            self._outbox.remove(batch)
            self._keys.discard(batch.key)
            signal.notify()

    async def _deliver(self, client: httpx.AsyncClient, batch: Batch) -> Reply | None:
        """Send ``batch`` until a 2xx (returns ``None``) or a refusal (returns it)."""
        return await self._retry.until_answered(lambda: self._attempt(client, batch))

    # -- reporting -----------------------------------------------------------------------------

    def _report(self, reason: str) -> None:
        label, spool, error = type(self).__name__, self.spool_dir, self._retry.last_error
        spool_error = self._unreported.spool_error  # a full disk hidden by a later failure
        if spool_error is not None and spool_error != error:
            error = spool_error if error is None else f"{error}; the spool: {spool_error}"
        for message in self._unreported.messages(label, self._target, spool, error):
            warnings.warn(message, MetricsUploadWarning, stacklevel=3)
        if self._outbox:
            points = sum(len(b.points) for b in self._outbox)
            in_memory = 0
            if not getattr(self._spool, "journaled", False):  # a journal has their points
                in_memory = sum(1 for b in self._outbox if b.unspoolable)
            message = undelivered_message(
                label, self._target, len(self._outbox), points, reason, spool, error,
                in_memory=in_memory,
            )  # fmt: skip
            warnings.warn(message, MetricsUploadWarning, stacklevel=3)
