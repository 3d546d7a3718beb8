"""HTTP delivery shared by the batching destinations: requests, retries, reports, statistics.

Used by :class:`~trainbus.loggers.HTTPMetricsUploader` and
:class:`~trainbus.loggers.MLflowLogger` (through ``_batching.py``).

Every attempt is bounded as a whole (:func:`attempt_deadline`): ``anyio.fail_after(timeout)`` covers
connecting, writing, every redirect hop and reading the answer, so a server that drips
its answer a byte at a time cannot hold a request longer than ``timeout`` (httpx's own
timeouts apply per read). The answer's body is streamed and only its first
:data:`BODY_LIMIT` bytes are kept (an error message needs no more); the connection of a
longer answer is closed, not drained.

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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from trainbus.core.exceptions import MetricsUploadWarning

if TYPE_CHECKING:
    import httpx

__all__ = [
    "checked_options",
    "BODY_LIMIT",
    "MetricsUploadWarning",
    "Reply",
    "RequestTimeout",
    "RetryableReply",
    "Signal",
    "MetricsUploadStatistics",
    "UploaderStatistics",
    "Unreported",
    "attempt_deadline",
    "backoff_delay",
    "positive",
    "require_httpx",
    "retry_after",
    "retryable",
    "send",
    "undelivered_message",
]

MAX_REDIRECTS = 5
BODY_LIMIT = 64 * 1024  # bytes of an answer's body kept; the rest is never read


def require_httpx(label: str) -> Any:
    """The ``httpx`` module, or an ``ImportError`` naming the extra to install."""
    try:
        import httpx
    except ImportError:
        raise ImportError(
            f"{label} needs httpx, which is not installed; "
            "install it with: pip install 'trainbus[http]'"
        ) from None
    return httpx


def positive(name: str, value: Any, example: str) -> float:
    """``value`` as a positive float, or a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name}={value!r} must be a positive number of seconds, e.g. {example}")
    return float(value)


def checked_options(
    batch_size: Any,
    flush_interval: Any,
    timeout: Any,
    close_timeout: Any,
    backoff: Any,
    max_backoff: Any,
) -> tuple[int, float, float, float, float, float]:
    """The delivery options of a batching destination, checked; errors name the argument."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be an int >= 1, e.g. 100")
    if isinstance(close_timeout, bool) or not isinstance(close_timeout, int | float) or not (
        close_timeout >= 0
    ):
        raise ValueError(f"close_timeout={close_timeout!r} must be seconds >= 0, e.g. 30")
    low = positive("backoff", backoff, "0.5")
    high = positive("max_backoff", max_backoff, "30.0")
    if high < low:
        raise ValueError(
            f"max_backoff={max_backoff!r} is below backoff={backoff!r}; raise max_backoff"
        )
    return (
        batch_size,
        positive("flush_seconds", flush_interval, "1.0"),
        positive("timeout", timeout, "10.0"),
        float(close_timeout),
        low,
        high,
    )


@dataclass(frozen=True, slots=True)
class MetricsUploadStatistics:
    """What an ``HTTPMetricsUploader`` or ``MLflowLogger`` has done so far (cumulative).

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


#: The old name of :class:`MetricsUploadStatistics` (``trainbus.loggers.UploaderStatistics``;
#: ``trainbus.callbacks`` has a class of that name too: ``CheckpointUploadStatistics``).
UploaderStatistics = MetricsUploadStatistics


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


@dataclass(frozen=True, slots=True)
class Reply:
    """An answer: its status, headers, and at most :data:`BODY_LIMIT` bytes of its body."""

    status: int
    headers: dict[str, str]
    body: bytes
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """Whether the status is a 2xx."""
        return 200 <= self.status < 300

    def describe(self) -> str:
        """``HTTP <status> '<start of the body>'`` for ``last_error`` and warnings."""
        text = self.body[:200].decode("utf-8", "replace")
        return f"HTTP {self.status} {text!r}"


class RequestTimeout(Exception):
    """An attempt did not complete within its total ``timeout``."""


class RetryableReply(Exception):
    """A setup request got an answer worth retrying (408, 429, 5xx)."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.describe())
        self.reply = reply


async def _bounded(
    client: httpx.AsyncClient, method: str, url: httpx.URL, headers: dict[str, str],
    body: bytes | None,
) -> Reply:
    async with client.stream(method, url, content=body, headers=headers) as response:
        chunks: list[bytes] = []
        kept = 0
        truncated = False
        async for chunk in response.aiter_bytes():
            chunks.append(chunk[: BODY_LIMIT - kept])
            kept += len(chunks[-1])
            if kept >= BODY_LIMIT:
                truncated = True  # closing the stream closes the connection: not drained
                break
        return Reply(response.status_code, dict(response.headers), b"".join(chunks), truncated)


async def send(
    client: httpx.AsyncClient, method: str, url: httpx.URL, headers: dict[str, str],
    body: bytes | None = None,
) -> Reply:
    """One attempt: ``method url``, following 307/308 redirects; the body read is bounded.

    ``headers`` (the user's, e.g. credentials) go only to ``url``'s host, and never from
    https to http; other hops carry only ``Content-Type`` and ``Idempotency-Key``. After
    :data:`MAX_REDIRECTS` hops the last 3xx is returned (and counts as a refusal). The
    caller bounds the whole attempt (``anyio.fail_after``; see :func:`attempt_deadline`).

    Raises:
        httpx.TransportError: The connection failed.
    """
    base = {k: v for k, v in headers.items() if k in ("Content-Type", "Idempotency-Key")}
    sent = headers
    target = url
    for _ in range(MAX_REDIRECTS):
        reply = await _bounded(client, method, target, sent, body)
        location = reply.headers.get("location")
        if reply.status not in (307, 308) or not location:
            return reply
        target = target.join(location)
        if target.host != url.host or (url.scheme == "https" and target.scheme != "https"):
            sent = base
    return await _bounded(client, method, target, sent, body)


@contextmanager
def attempt_deadline(seconds: float) -> Iterator[None]:
    """Bound an attempt as a whole; raise :class:`RequestTimeout` when it runs out."""
    try:
        with anyio.fail_after(seconds):
            yield
    except TimeoutError:
        raise RequestTimeout(
            f"no complete answer within timeout={seconds:g}s (the whole request)"
        ) from None


@dataclass
class Unreported:
    """Refusals and failed spool reads/writes since the last ``close`` report."""

    rejected_batches: int = 0
    rejected_points: int = 0
    statuses: set[int] = field(default_factory=set)
    spool_failures: int = 0
    spool_error: str | None = None  # the last failed spool (or journal) operation
    finish_error: str | None = None  # the request that ends the run failed

    def messages(
        self, label: str, url: str, spool: Path | None, last_error: str | None
    ) -> list[str]:
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
                f"{label}: {url} refused {self.rejected_batches} batch(es) "
                f"({self.rejected_points} points) with HTTP {codes}; they were not retried "
                f"and {kept}. Last response: {last_error}. Check the URL, the headers "
                "(credentials) and the wire format the server expects"
            )
        if self.spool_failures:
            out.append(
                f"{label}: {self.spool_failures} spool operation(s) failed in "
                f"spool_dir={str(spool)!r} (last error: {self.spool_error or last_error}); "
                "the batches concerned "
                "were kept in memory only, and files of earlier runs may not have been "
                "resent. Free space or fix the directory's permissions"
            )
        if self.finish_error is not None:
            out.append(
                f"{label}: ending the run at {url} failed ({self.finish_error}); the run "
                "keeps its last status on the server"
            )
            self.finish_error = None
        self.rejected_batches = self.rejected_points = self.spool_failures = 0
        self.spool_error = None
        self.statuses.clear()
        return out


def undelivered_message(
    label: str, url: str, batches: int, points: int, reason: str, spool: Path | None,
    last_error: str | None, *, in_memory: int = 0,
) -> str:
    """The warning for batches still undelivered when ``close`` stopped waiting.

    ``reason`` says why it stopped, e.g. ``"within close_timeout=30s"``; ``in_memory``
    counts the batches that could not be written to the spool (a full disk).
    """
    if spool is not None:
        fate = (
            f"they stay in spool_dir={str(spool)!r} and the next {label} started with "
            "that spool_dir resends them unchanged (same run, same keys)"
        )
        if in_memory:
            fate = (
                f"{in_memory} of them could not be written to spool_dir={str(spool)!r} and "
                f"are lost when this process exits; the others stay there and the next "
                f"{label} started with that spool_dir resends them unchanged"
            )
    else:
        fate = (
            "they are lost when this process exits (unless this trainer fits again); "
            "pass spool_dir=... to keep undelivered points on disk, or raise close_timeout"
        )
    return (
        f"{label}: {points} points in {batches} batch(es) were not delivered to {url} "
        f"{reason} (last error: {last_error}); {fate}"
    )
