"""Attempts until the server answers: backoff, a total deadline per attempt, counters.

:class:`Retrier` is what :class:`~trainbus.loggers._batching.BatchingDestination` uses for
every request (batches, opening and ending a run). Each attempt runs under
:func:`~trainbus.loggers._delivery.attempt_deadline`; connection errors, timeouts and
retryable statuses (:func:`~trainbus.loggers._delivery.retryable`) are retried after
:func:`~trainbus.loggers._delivery.backoff_delay`, never sooner than ``Retry-After``.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from trainbus.loggers._delivery import (
    Reply,
    RequestTimeout,
    RetryableReply,
    attempt_deadline,
    backoff_delay,
    retry_after,
    retryable,
)

__all__ = ["Retrier"]

T = TypeVar("T")


class Retrier:
    """Retries transient failures with capped, jittered backoff; counts and describes them.

    Args:
        backoff: Seconds before the first retry; doubles per retry.
        max_backoff: Seconds; the cap of the doubling.
        timeout: Seconds one attempt may take as a whole.
        on_failure: Called after each failed attempt (before its backoff).
    """

    def __init__(
        self, backoff: float, max_backoff: float, timeout: float, on_failure: Callable[[], None]
    ) -> None:
        self.backoff, self.max_backoff, self.timeout = backoff, max_backoff, timeout
        self.retries = 0
        self.last_error: str | None = None
        self._on_failure = on_failure
        self._rng = random.Random()
        self._sleeper: anyio.Event | None = None

    def wake(self) -> None:
        """Cut a backoff wait short (not a ``Retry-After`` wait): retry now."""
        if self._sleeper is not None:
            self._sleeper.set()

    def transient(self, exc: BaseException) -> bool:
        """Whether ``exc`` from an attempt is worth another (and note it as the last error)."""
        import httpx

        if isinstance(exc, RetryableReply):
            self.last_error = exc.reply.describe()
            return True
        if isinstance(exc, httpx.TransportError | RequestTimeout):
            self.last_error = f"{type(exc).__name__}: {exc}".rstrip(": ")
            return True
        return False

    async def until_done(self, call: Callable[[], Awaitable[T]]) -> T:
        """``await call()`` until it returns; transient failures are retried, others raise."""
        attempt = 0
        while True:
            try:
                with attempt_deadline(self.timeout):
                    return await call()
            except Exception as exc:
                if not self.transient(exc):
                    raise
            attempt += 1
            await self._failed(attempt, 0.0)

    async def until_answered(
        self, attempt_once: Callable[[], Awaitable[Reply]], *, once: bool = False
    ) -> Reply | None:
        """Attempt until a 2xx (``None``) or a refusal (the reply).

        With ``once``, a failed attempt is not retried: it raises :class:`RequestTimeout`.
        """
        attempt = 0
        while True:
            at_least = 0.0
            try:
                with attempt_deadline(self.timeout):
                    reply = await attempt_once()
            except Exception as exc:
                if not self.transient(exc):
                    raise
            else:
                if reply.ok:
                    return None
                self.last_error = reply.describe()
                if not retryable(reply.status):
                    return reply
                at_least = retry_after(reply.headers.get("retry-after"))
            if once:
                raise RequestTimeout(f"not retried, the run is closing: {self.last_error}")
            attempt += 1
            await self._failed(attempt, at_least)

    async def _failed(self, attempt: int, at_least: float) -> None:
        self.retries += 1
        self._on_failure()
        delay = backoff_delay(attempt, self.backoff, self.max_backoff, self._rng)
        if at_least:
            await anyio.sleep(max(delay, at_least))  # the server asked: close waits too
        else:
            sleeper = self._sleeper = anyio.Event()
            with anyio.move_on_after(delay):
                await sleeper.wait()
            self._sleeper = None
