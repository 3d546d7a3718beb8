"""``HTTPMetricsUploader``: batches logged metrics and POSTs them, with retries and a spool.

Wire format (SPEC section 5): ``POST url``, JSON body ``{"run": str, "points": [{"name",
"value", "step", "wall_time"}]}``, header ``Idempotency-Key``: a uuid4 drawn when the batch
is sealed, the same on every retry and after a restart from the spool, so a server that
keeps the first request per key never stores a point twice. ``docs/loggers.md`` has the
whole contract; ``_batching.py`` how batches are staged, spooled, sent and waited for at
close (shared with :class:`~trainbus.loggers.MLflowLogger`); ``_delivery.py`` the retry,
timeout and redirect rules; ``_spool.py`` the files.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio

from trainbus.core.renamed import renamed_option
from trainbus.loggers._batching import BatchingDestination
from trainbus.loggers._delivery import (
    MetricsUploadStatistics,
    MetricsUploadWarning,
    Reply,
    UploaderStatistics,
    require_httpx,
    send,
)

if TYPE_CHECKING:
    import httpx

    from trainbus.core.logger import Logger, LogRecord
    from trainbus.core.state import State
    from trainbus.loggers._spool import Batch

__all__ = [
    "HTTPMetricsUploader",
    "MetricsUploadStatistics",
    "MetricsUploadWarning",
    "UploaderStatistics",
    "as_number",
]


def as_number(value: Any) -> float | None:
    """The value as a finite float, or ``None`` for what is not a point (bools included)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


class HTTPMetricsUploader(BatchingDestination):
    """Uploads logged metrics in batches over HTTP, retrying until the server has them.

    Requires the ``http`` extra (``pip install 'trainbus[http]'``). Connection errors,
    timeouts, 408, 429 and 5xx are retried with backoff (honouring ``Retry-After``);
    other statuses are refusals, not retried and reported by ``close``. The section
    "HTTPMetricsUploader" of ``docs/loggers.md`` gives the whole contract.

    Args:
        url: The endpoint that receives ``POST`` requests (``http`` or ``https``).
        batch_size: Points per request at most; a full buffer is sealed at once.
        flush_seconds: Seconds; the partial buffer is sealed and sent this often.
        flush_interval: Deprecated name of ``flush_seconds`` (warns once).
        spool_dir: A directory where each batch is written before its first attempt
            and deleted after a 2xx; batches left there by an earlier run are resent
            when the uploader starts. ``None`` keeps batches in memory only.
        headers: Extra request headers (e.g. ``Authorization``), sent only to ``url``'s
            host.
        timeout: Seconds one attempt may take as a whole: connecting, sending, every
            redirect hop and reading the answer (of which at most 64 KiB is read).
        close_timeout: Seconds ``close`` waits for undelivered batches. When the run
            failed or was cancelled and every batch is in ``spool_dir``, ``close`` waits
            only until an attempt fails (the spool keeps the rest for the next run).
        backoff: Seconds before the first retry; doubles per retry of a batch.
        max_backoff: Seconds; the cap of the doubling.
        run_name: The ``run`` sent with the points; default ``state.run_name``.
        journal: Keep a write-ahead journal of every point in ``spool_dir`` (which it
            requires) instead of one file per batch: a point is written before it counts
            as logged, each batch's key before its first attempt, and the uploader's
            ``state_dict`` (saved in checkpoints) records the journal's position, so a run
            resumed from a checkpoint after a crash sends every point exactly once. The
            default, ``None``, journals whenever the uploader has a ``spool_dir`` and the
            run a :class:`~trainbus.callbacks.CheckpointSaver` (decided by the
            ``Trainer``); ``False`` keeps one spool file per batch. See "What is
            guaranteed" below and ``docs/crash-consistency.md``.

    What is guaranteed, for a run killed (``SIGKILL``, OOM, a lost node) and resumed from
    its newest checkpoint (``Trainer(load_path=...)``), at a server that keeps the first
    request per ``Idempotency-Key``:

    - with a ``spool_dir`` and a ``CheckpointSaver`` (the journal, by default): every point
      of the uninterrupted run reaches the server exactly once;
    - with a ``spool_dir`` and ``journal=False``: no batch the killed run sealed is lost or
      stored twice, but the points it logged after its last checkpoint are logged again by
      the resumed run under new keys (stored twice), and points not yet sealed are lost;
    - without a ``spool_dir``: what was not delivered when the process died is lost, and
      what was delivered after the checkpoint is stored twice.

    A resumed run whose uploader cannot be exactly once warns once
    (:class:`MetricsUploadWarning`). A retry never duplicates a batch in any case.

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

    rank_zero_only = True  # under torchrun: rank 0 only (docs/distributed.md)
    #: Its handlers read only their event's snapshot and the records it receives, never
    #: the live model: they may trail training by 2 batches (``docs/concurrency.md``,
    #: "Trailing handlers"). A subclass that reads live state sets ``trailing = None``.
    trailing = 2

    def __init__(
        self,
        url: str,
        *,
        batch_size: int = 100,
        flush_seconds: float = 1.0,
        spool_dir: str | os.PathLike[str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 10.0,
        close_timeout: float = 30.0,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        run_name: str | None = None,
        journal: bool | None = None,
        flush_interval: float | None = None,
    ) -> None:
        httpx = require_httpx("HTTPMetricsUploader")
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, TypeError):
            parsed = None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(
                f"url={url!r} is not an http(s) URL; pass e.g. 'https://metrics.example.com/points'"
            )
        if headers is not None and not isinstance(headers, Mapping):
            raise TypeError(f"headers must be a mapping of names to values, got {headers!r}")
        if run_name is not None and not isinstance(run_name, str):
            raise TypeError(f"run_name={run_name!r} must be a str or None")
        if journal is not None and not isinstance(journal, bool):
            raise TypeError(f"journal={journal!r} must be True, False or None (the default)")
        if journal and spool_dir is None:
            raise ValueError(
                "journal=True needs a spool_dir to keep the journal in; pass "
                "spool_dir='runs/spool', or journal=False"
            )
        super().__init__(
            str(parsed),
            batch_size=batch_size,
            flush_interval=renamed_option(
                "HTTPMetricsUploader", "flush_interval", flush_interval, "flush_seconds",
                flush_seconds, default=1.0,
            ),
            spool_dir=spool_dir,
            journal=journal,
            timeout=timeout,
            close_timeout=close_timeout,
            backoff=backoff,
            max_backoff=max_backoff,
        )
        self.url = str(parsed)
        self.headers = dict(headers or {})
        self.run_name = run_name
        self._url = parsed

    def _why_not_exactly_once(self) -> str:
        if self.spool_dir is None:
            return (
                "HTTPMetricsUploader has no spool_dir, so it cannot deliver each point "
                "exactly once across a crash; pass spool_dir='...' (with a CheckpointSaver "
                "it then journals every point)"
            )
        return (
            "HTTPMetricsUploader(journal=False) cannot deliver each point exactly once "
            "across a crash; leave journal at its default (None) or pass journal=True"
        )

    def _items(self, record: LogRecord) -> list[dict[str, Any]]:
        """One point per finite numeric metric; hyperparameters are not points."""
        if record.hyperparameters:
            return []
        step, wall_time, items = int(record.step), float(record.wall_time), []
        for name, value in record.metrics.items():
            number = as_number(value)
            if number is None:
                self._skipped += 1
                continue
            items.append({"name": name, "value": number, "step": step, "wall_time": wall_time})
        if self._journal is not None and items:  # on disk before it counts as logged
            try:
                return self._journal.admit(items)
            except OSError as exc:  # raised (training stops), and named in close's warning
                self._retry.last_error = f"writing the journal: {exc}"
                raise
        return items

    async def log_record(self, record: LogRecord) -> None:
        """Buffer the record's points, on the event loop; seal a full batch. No I/O."""
        self._add(self._items(record), record.hyperparameters)

    async def fit_start(self, state: State, logger: Logger) -> None:
        """Open the journal (reading what a killed run left) off the event loop."""
        if self._journal is not None:
            await anyio.to_thread.run_sync(self._journal.open)

    async def close(self, state: State, logger: Logger) -> None:
        """Deliver what is left (see the base class); then close or retire the journal.

        A journal is deleted when the run completed (not stopped early) and every batch
        was delivered; otherwise it stays for the run that resumes.
        """
        try:
            await super().close(state, logger)
        finally:
            journal = self._journal
            if journal is not None:
                done = self._completed and not state.stop_requested
                done = done and not (self._outbox or self._buffer or self._to_spool)
                await anyio.to_thread.run_sync(journal.retire if done else journal.close)

    def state_dict(self) -> dict[str, Any]:
        """With a journal: its position at this checkpoint (see ``docs/crash-consistency.md``)."""
        return self._journal.state_dict() if self._journal is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """With a journal: drop the points the run that saved ``state`` journaled after it."""
        if self._journal is not None and state:
            self._journal.load_state_dict(state)

    async def _open(self, client: httpx.AsyncClient, state: State) -> str:
        return self.run_name if self.run_name is not None else state.run_name

    async def _attempt(self, client: httpx.AsyncClient, batch: Batch) -> Reply:
        headers = {
            **self.headers, "Content-Type": "application/json", "Idempotency-Key": batch.key
        }
        return await send(client, "POST", self._url, headers, batch.body())
