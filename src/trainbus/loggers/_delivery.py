"""HTTP delivery for ``HTTPMetricsUploader``: retry policy, redirects, reports, statistics.

Retry policy: connection errors, timeouts, 408, 429 and 5xx are retried
(:func:`retryable`); the wait before retry *n* is drawn from ``[cap/2, cap]`` with
``cap = min(max_backoff, backoff * 2**(n-1))`` ("equal jitter", :func:`backoff_delay`),
and never shorter than the server's ``Retry-After`` (:func:`retry_after`). Everything
else that is not a 2xx is a refusal.

Redirects are followed by hand (:func:`post_batch`), only for 307/308 (which keep the
method and body), and the caller's headers travel only to the configured host: the
client never follows redirects itself, so credentials cannot leak to another host.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from trainbus._exceptions import MetricsUploadWarning

if TYPE_CHECKING:
    import httpx

    from trainbus.loggers._spool import Batch

__all__ = [
    "MetricsUploadWarning",
    "Signal",
    "UploaderStatistics",
    "Unreported",
    "backoff_delay",
    "post_batch",
    "retry_after",
    "retryable",
    "undelivered_message",
]

MAX_REDIRECTS = 5


@dataclass(frozen=True, slots=True)
class UploaderStatistics:
    """What an ``HTTPMetricsUploader`` has done so far (cumulative over fits).

    Attributes:
        points_sent: Points in batches the server acknowledged with a 2xx.
        batches_sent: Batches acknowledged with a 2xx.
        retries: Attempts after a failed one (all batches together).
        spooled_batches: Batches on disk now, waiting for delivery.
        pending_batches: Sealed batches not yet delivered.
        pending_points: Points not yet delivered (sealed or still buffered).
        rejected_batches: Batches the server refused (4xx), not retried.
        recovered_batches: Batches picked up from files an earlier run left in the spool.
        skipped_values: Logged values that are not finite numbers, not sent.
        last_error: The last failure (exception or status), or ``None``.

    Example:
        >>> uploader.statistics().points_sent
        400
    """

    points_sent: int
    batches_sent: int
    retries: int
    spooled_batches: int
    pending_batches: int
    pending_points: int
    rejected_batches: int
    recovered_batches: int
    skipped_values: int
    last_error: str | None


class Signal:
    """A re-armable wake-up for coroutines on one loop: ``notify`` wakes every waiter."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = anyio.Event()

    async def wait(self) -> None:
        await self._event.wait()


def retryable(status: int) -> bool:
    """Whether a response with ``status`` is worth another attempt."""
    return status in (408, 429) or status >= 500


def retry_after(value: str | None) -> float:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return 0.0
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError, OverflowError):
            return 0.0
    return seconds if math.isfinite(seconds) and seconds > 0 else 0.0


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Seconds before retry number ``attempt`` (1, 2, ...): doubling, capped, jittered."""
    ceiling = min(cap, base * 2.0 ** min(attempt - 1, 60))
    return ceiling / 2 + rng.uniform(0, ceiling / 2)


async def post_batch(
    client: httpx.AsyncClient, url: httpx.URL, headers: dict[str, str], batch: Batch
) -> httpx.Response:
    """One attempt at delivering ``batch`` to ``url``, following 307/308 redirects.

    ``headers`` (the user's, e.g. credentials) go only to ``url``'s host, and never from
    https to http; other hops carry only ``Content-Type`` and ``Idempotency-Key``. After
    :data:`MAX_REDIRECTS` hops the last 3xx is returned (and counts as a refusal).
    """
    base = {"Content-Type": "application/json", "Idempotency-Key": batch.key}
    sent = {**headers, **base}
    body = batch.body()
    target = url
    for _ in range(MAX_REDIRECTS):
        response = await client.post(target, content=body, headers=sent)
        location = response.headers.get("location")
        if response.status_code not in (307, 308) or not location:
            return response
        target = target.join(location)
        if target.host != url.host or (url.scheme == "https" and target.scheme != "https"):
            sent = base
    return await client.post(target, content=body, headers=sent)


@dataclass
class Unreported:
    """Refusals and failed spool reads/writes since the last ``close`` report."""

    rejected_batches: int = 0
    rejected_points: int = 0
    statuses: set[int] = field(default_factory=set)
    spool_failures: int = 0

    def messages(self, url: str, spool: Path | None, last_error: str | None) -> list[str]:
        """The warnings to emit (one per kind of problem); resets the counts."""
        out = []
        if self.rejected_batches:
            codes = ", ".join(str(s) for s in sorted(self.statuses))
            kept = (
                f"their bodies are kept as *.rejected.json in spool_dir={str(spool)!r}"
                if spool is not None
                else "they were dropped (pass spool_dir=... to keep refused batches)"
            )
            out.append(
                f"HTTPMetricsUploader: {url} refused {self.rejected_batches} batch(es) "
                f"({self.rejected_points} points) with HTTP {codes}; they were not retried "
                f"and {kept}. Last response: {last_error}. Check the URL, the headers "
                "(credentials) and the wire format the server expects"
            )
        if self.spool_failures:
            out.append(
                f"HTTPMetricsUploader: {self.spool_failures} spool operation(s) failed in "
                f"spool_dir={str(spool)!r} (last error: {last_error}); the batches concerned "
                "were kept in memory only, and files of earlier runs may not have been "
                "resent. Free space or fix the directory's permissions"
            )
        self.rejected_batches = self.rejected_points = self.spool_failures = 0
        self.statuses.clear()
        return out


def undelivered_message(
    url: str, batches: int, points: int, close_timeout: float, spool: Path | None,
    last_error: str | None,
) -> str:
    """The warning for batches still undelivered when ``close_timeout`` ran out."""
    if spool is not None:
        fate = (
            f"they stay in spool_dir={str(spool)!r} and the next HTTPMetricsUploader "
            "started with that spool_dir resends them with their Idempotency-Keys"
        )
    else:
        fate = (
            "they are lost when this process exits (unless this trainer fits again); "
            "pass spool_dir=... to keep undelivered points on disk"
        )
    return (
        f"HTTPMetricsUploader: {points} points in {batches} batch(es) were not delivered "
        f"to {url} within close_timeout={close_timeout:g}s (last error: {last_error}); "
        f"{fate}, or raise close_timeout"
    )
