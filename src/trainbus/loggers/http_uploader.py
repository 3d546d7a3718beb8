"""``HTTPMetricsUploader``: batches logged metrics and POSTs them, with retries and a spool.

Wire format (SPEC section 5): ``POST url``, JSON body ``{"run": str, "points": [{"name",
"value", "step", "wall_time"}]}``, header ``Idempotency-Key``: a uuid4 drawn when the batch
is sealed, the same on every retry and after a restart from the spool, so a server that
keeps the first request per key never stores a point twice. ``docs/loggers.md`` has the
whole contract; ``_delivery.py`` the retry and redirect rules; ``_spool.py`` the files.

How it runs, all on the event loop: ``log_record`` appends points to a buffer and seals
a batch per ``batch_size`` points (no I/O). ``background`` runs the *stager* (seals the
partial buffer every ``flush_interval``, writes sealed batches to the spool in a worker
thread, times ``close``) and the *sender* (POSTs the oldest batch until a 2xx or a
refusal; with a spool, only batches already on disk, so each is spooled before its first
attempt). ``close`` seals the rest, waits up to ``close_timeout`` and reports.

Why ``log_record`` is ``async def``: the uploader's handlers are then all coroutines, so
its lane is a loop lane. The buffer, the outbox and the wake-up signal are only touched
from the loop thread: no locks, and the sender is woken with a plain ``anyio.Event``
(not thread-safe). A plain ``def log_record`` would give the uploader a thread of its
own, a GIL hand-off per record, and a thread-safe hand-off (``call_soon_threadsafe`` plus
a lock shared with the flush timer) per batch. The only blocking work, the spool's
``fsync``, runs in a worker thread; and the uploader handles no events, so the training
thread never waits for it at a barrier.
"""

from __future__ import annotations

import itertools
import math
import numbers
import os
import random
import uuid
import warnings
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio

from trainbus._logger import LoggerDestination, LogRecord
from trainbus.loggers._delivery import (
    MetricsUploadWarning,
    Signal,
    Unreported,
    UploaderStatistics,
    backoff_delay,
    post_batch,
    retry_after,
    retryable,
    undelivered_message,
)
from trainbus.loggers._spool import Batch, Spool

if TYPE_CHECKING:
    from pathlib import Path
    from types import ModuleType

    import httpx

    from trainbus._logger import Logger
    from trainbus._state import State

__all__ = ["HTTPMetricsUploader", "MetricsUploadWarning", "UploaderStatistics"]


def _require_httpx() -> ModuleType:
    try:
        import httpx
    except ImportError:
        raise ImportError(
            "HTTPMetricsUploader needs httpx, which is not installed; "
            "install it with: pip install 'trainbus[http]'"
        ) from None
    return httpx


def _as_number(value: Any) -> float | None:
    """The value as a finite float, or ``None`` for what is not a point (bools included)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _positive(name: str, value: Any, example: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name}={value!r} must be a positive number of seconds, e.g. {example}")
    return float(value)


class HTTPMetricsUploader(LoggerDestination):
    """Uploads logged metrics in batches over HTTP, retrying until the server has them.

    Requires the ``http`` extra (``pip install 'trainbus[http]'``). Connection errors,
    timeouts, 408, 429 and 5xx are retried with backoff (honouring ``Retry-After``);
    other statuses are refusals, not retried and reported by ``close``. The section
    "HTTPMetricsUploader" of ``docs/loggers.md`` gives the whole contract.

    Args:
        url: The endpoint that receives ``POST`` requests (``http`` or ``https``).
        batch_size: Points per request at most; a full buffer is sealed at once.
        flush_interval: Seconds; the partial buffer is sealed and sent this often.
        spool_dir: A directory where each batch is written before its first attempt
            and deleted after a 2xx; batches left there by an earlier run are resent
            when the uploader starts. ``None`` keeps batches in memory only.
        headers: Extra request headers (e.g. ``Authorization``), sent only to ``url``'s
            host.
        timeout: Seconds for each request (connect, read, write, pool).
        close_timeout: Seconds ``close`` waits for undelivered batches.
        backoff: Seconds before the first retry; doubles per retry of a batch.
        max_backoff: Seconds; the cap of the doubling.
        run_name: The ``run`` sent with the points; default ``state.run_name``.

    Attributes:
        points_sent: Points the server acknowledged (2xx).
        batches_sent: Batches the server acknowledged.
        retries: Attempts after a failed one.
        spooled_batches: Batches on disk now, waiting for delivery.

    Raises:
        ImportError: httpx is not installed.
        ValueError: An argument is out of range; the message names it.

    Example:
        >>> uploader = HTTPMetricsUploader(
        ...     "https://metrics.example.com/v1/points",
        ...     headers={"Authorization": f"Bearer {token}"},
        ...     spool_dir="runs/spool",
        ... )
        >>> trainer = Trainer(model, loader, "2ep", loggers=[uploader])
        >>> await trainer.fit()
        >>> uploader.statistics().points_sent
        400
    """

    def __init__(
        self,
        url: str,
        *,
        batch_size: int = 100,
        flush_interval: float = 1.0,
        spool_dir: str | os.PathLike[str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 10.0,
        close_timeout: float = 30.0,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        run_name: str | None = None,
    ) -> None:
        httpx = _require_httpx()
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, TypeError):
            parsed = None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(
                f"url={url!r} is not an http(s) URL; pass e.g. 'https://metrics.example.com/points'"
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be an int >= 1, e.g. 100")
        if isinstance(close_timeout, bool) or not isinstance(close_timeout, int | float) or not (
            close_timeout >= 0
        ):
            raise ValueError(f"close_timeout={close_timeout!r} must be seconds >= 0, e.g. 30")
        self.url = str(parsed)
        self.batch_size = batch_size
        self.flush_interval = _positive("flush_interval", flush_interval, "1.0")
        self.timeout = _positive("timeout", timeout, "10.0")
        self.close_timeout = float(close_timeout)
        self.backoff = _positive("backoff", backoff, "0.5")
        self.max_backoff = _positive("max_backoff", max_backoff, "30.0")
        if self.max_backoff < self.backoff:
            raise ValueError(
                f"max_backoff={max_backoff!r} is below backoff={backoff!r}; raise max_backoff"
            )
        if headers is not None and not isinstance(headers, Mapping):
            raise TypeError(f"headers must be a mapping of names to values, got {headers!r}")
        self.headers = dict(headers or {})
        self.run_name = run_name
        self._url = parsed
        # Built once, here: an SSL context costs ~20 ms of GIL-holding work, which every
        # AsyncClient would otherwise repeat at the start of each fit, beside training.
        self._ssl_context = httpx.create_ssl_context()
        self._spool = Spool(spool_dir) if spool_dir is not None else None
        self._rng = random.Random()
        self._seq = itertools.count()
        self._buffer: list[dict[str, Any]] = []
        self._outbox: deque[Batch] = deque()  # sealed, undelivered, oldest first
        self._to_spool: deque[Batch] = deque()  # sealed, not yet on disk (spool only)
        self._keys: set[str] = set()
        self._signal: Signal | None = None
        self._sleeper: anyio.Event | None = None  # set by close to cut a backoff short
        self._close_done: anyio.Event | None = None  # set when close may report
        self._close_deadline = math.inf
        self._state_run = "run"
        self.points_sent = self.batches_sent = self.retries = self.spooled_batches = 0
        self._rejected = self._recovered = self._skipped = 0
        self._unreported = Unreported()
        self._last_error: str | None = None

    # -- what training calls -----------------------------------------------------------------

    async def log_record(self, record: LogRecord) -> None:
        """Buffer one point per numeric metric; seal a batch when ``batch_size`` are buffered.

        Hyperparameters and values that are not finite numbers are not points. No I/O.
        """
        if record.hyperparameters:
            return
        step, wall_time, buffer = int(record.step), float(record.wall_time), self._buffer
        for name, value in record.metrics.items():
            number = _as_number(value)
            if number is None:
                self._skipped += 1
                continue
            buffer.append({"name": name, "value": number, "step": step, "wall_time": wall_time})
        if len(buffer) >= self.batch_size:
            self._seal(partial=False)

    async def background(self, state: State, logger: Logger) -> None:
        """Resend what an earlier run left in the spool, then stage and send batches."""
        httpx = _require_httpx()
        self._state_run = state.run_name
        signal = self._signal = Signal()
        try:
            if self._spool is not None:
                await self._recover(self._spool)
            client = httpx.AsyncClient(
                verify=self._ssl_context, timeout=self.timeout, follow_redirects=False
            )
            async with client, anyio.create_task_group() as tg:
                tg.start_soon(self._stager, signal)
                await self._sender(client, signal)
        finally:
            self._signal = None
            if self._close_done is not None:  # a close waiting for this task stops waiting
                self._close_done.set()
                self._close_done = None
                self._close_deadline = math.inf

    async def close(self, state: State, logger: Logger) -> None:
        """Seal the rest, wait up to ``close_timeout`` for delivery, report what is left.

        Emits a :class:`MetricsUploadWarning` when batches were refused, or when some
        are still undelivered (naming the spool that keeps them, or the points lost).
        """
        self._seal(partial=True)
        signal = self._signal
        if signal is not None and (self._outbox or self._to_spool):
            # The stager enforces the deadline and sets ``done`` (see _check_close).
            done = self._close_done = anyio.Event()
            self._close_deadline = anyio.current_time() + self.close_timeout
            if self._sleeper is not None:
                self._sleeper.set()  # retry now: the server may be back
            signal.notify()
            await done.wait()
        self._report()

    # -- observability -------------------------------------------------------------------------

    def statistics(self) -> UploaderStatistics:
        """Counters of what was sent, retried, spooled and refused (safe from any thread)."""
        outbox = list(self._outbox)
        return UploaderStatistics(
            points_sent=self.points_sent,
            batches_sent=self.batches_sent,
            retries=self.retries,
            spooled_batches=self.spooled_batches,
            pending_batches=len(outbox),
            pending_points=sum(len(b.points) for b in outbox) + len(self._buffer),
            rejected_batches=self._rejected,
            recovered_batches=self._recovered,
            skipped_values=self._skipped,
            last_error=self._last_error,
        )

    @property
    def spool_dir(self) -> Path | None:
        """The spool directory, or ``None``."""
        return self._spool.directory if self._spool is not None else None

    # -- staging -------------------------------------------------------------------------------

    def _seal(self, *, partial: bool) -> None:
        buffer, size = self._buffer, self.batch_size
        sealed = False
        while len(buffer) >= size or (partial and buffer):
            batch = Batch(key=str(uuid.uuid4()), points=buffer[:size], seq=next(self._seq))
            del buffer[:size]
            self._outbox.append(batch)
            self._keys.add(batch.key)
            if self._spool is not None:
                self._to_spool.append(batch)
            sealed = True
        if sealed and self._signal is not None:
            self._signal.notify()

    def _prepare(self, batch: Batch) -> None:
        if batch.run is None:
            batch.run = self.run_name if self.run_name is not None else self._state_run

    async def _recover(self, spool: Spool) -> None:
        try:
            batches, corrupt = await anyio.to_thread.run_sync(spool.load)
        except OSError as exc:  # an unreadable spool must not stop training either
            self._unreported.spool_failures += 1
            self._last_error = f"reading the spool: {exc}"
            return
        fresh = [b for b in batches if b.key not in self._keys]
        for batch in reversed(fresh):  # older than anything sealed by this run
            self._outbox.appendleft(batch)
            self._keys.add(batch.key)
        self._recovered += len(fresh)
        self.spooled_batches += len(fresh)
        if corrupt:
            self._last_error = f"unreadable spool files renamed: {[str(p) for p in corrupt]}"

    async def _stager(self, signal: Signal) -> None:
        """Seal the buffer every ``flush_interval``, spool sealed batches, time ``close``."""
        next_flush = anyio.current_time() + self.flush_interval
        while True:
            now = anyio.current_time()
            if now >= next_flush:
                self._seal(partial=True)
                next_flush = now + self.flush_interval
            if self._spool is not None and self._to_spool:
                batch = self._to_spool[0]
                self._prepare(batch)
                try:
                    await anyio.to_thread.run_sync(self._spool.write, batch)
                except OSError as exc:  # a full disk must not stop training: send from memory
                    batch.unspoolable = True
                    self._unreported.spool_failures += 1
                    self._last_error = f"writing the spool: {exc}"
                else:
                    self.spooled_batches += 1
                self._to_spool.popleft()  # only now: a cancelled write is redone next time
                signal.notify()
                continue
            self._check_close(now)
            with anyio.move_on_after(min(next_flush, self._close_deadline) - now):
                await signal.wait()

    def _check_close(self, now: float) -> None:
        """Let a waiting ``close`` report: all delivered, or its deadline passed and all
        that is left is on disk (or there is no spool)."""
        done = self._close_done
        if done is None or self._to_spool:
            return
        if not self._outbox or now >= self._close_deadline:
            self._close_done = None
            self._close_deadline = math.inf
            done.set()

    # -- sending -------------------------------------------------------------------------------

    async def _sender(self, client: httpx.AsyncClient, signal: Signal) -> None:
        while True:
            batch = self._outbox[0] if self._outbox else None
            if batch is None or (self._spool and not (batch.spooled or batch.unspoolable)):
                await signal.wait()
                continue
            self._prepare(batch)
            status = await self._deliver(client, batch)
            spool = self._spool
            if status is None:
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
                self._unreported.statuses.add(status)
            self._outbox.remove(batch)
            self._keys.discard(batch.key)
            signal.notify()

    async def _deliver(self, client: httpx.AsyncClient, batch: Batch) -> int | None:
        """POST ``batch`` until a 2xx (returns ``None``) or a refusal (returns its status)."""
        import httpx

        attempt = 0
        while True:
            at_least = 0.0
            try:
                response = await post_batch(client, self._url, self.headers, batch)
            except httpx.TransportError as exc:
                self._last_error = f"{type(exc).__name__}: {exc}".rstrip(": ")
            else:
                status = response.status_code
                if 200 <= status < 300:
                    return None
                self._last_error = f"HTTP {status} {response.text[:200]!r}"
                if not retryable(status):
                    return status
                at_least = retry_after(response.headers.get("retry-after"))
            attempt += 1
            self.retries += 1
            delay = backoff_delay(attempt, self.backoff, self.max_backoff, self._rng)
            if at_least:
                await anyio.sleep(max(delay, at_least))  # the server asked: close waits too
            else:
                sleeper = self._sleeper = anyio.Event()
                with anyio.move_on_after(delay):
                    await sleeper.wait()
                self._sleeper = None

    # -- reporting -----------------------------------------------------------------------------

    def _report(self) -> None:
        spool = self._spool.directory if self._spool is not None else None
        for message in self._unreported.messages(self.url, spool, self._last_error):
            warnings.warn(message, MetricsUploadWarning, stacklevel=2)
        if self._outbox:
            points = sum(len(b.points) for b in self._outbox)
            message = undelivered_message(
                self.url, len(self._outbox), points, self.close_timeout, spool, self._last_error
            )
            warnings.warn(message, MetricsUploadWarning, stacklevel=2)
