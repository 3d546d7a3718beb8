"""Random callbacks and logger destinations for the property test (``test_properties.py``).

A :class:`Spec` says how one random callback (or destination) behaves; :func:`probe_class`
builds a class with fresh handler functions for it. Every handler stamps a counter shared
by all probes and by the producer when it starts and ends, so the order of everything
that happened on any thread can be compared afterwards.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass
from typing import Any

import anyio
from hypothesis import strategies as st

from trainbus import Callback, Event, LoggerDestination, blocking

__all__ = (
    "BARRIER_CHOICES",
    "BATCH",
    "TYPES",
    "Boom",
    "DestProbe",
    "Probe",
    "Spec",
    "dest_specs",
    "probe_class",
    "specs",
)

E = Event
BATCH = (E.BATCH_START, E.AFTER_FORWARD, E.AFTER_BACKWARD, E.BATCH_END, E.BATCH_CHECKPOINT)
TYPES = (E.FIT_START, *BATCH, E.EPOCH_END, E.FIT_END)
BARRIER_CHOICES = (E.BATCH_END, E.AFTER_FORWARD, E.EPOCH_END)


class Boom(Exception):
    """The injected failure."""


@dataclass(frozen=True)
class Spec:
    """How one random callback (or logger destination) behaves."""

    is_async: bool  # its handlers (and close/post_close) are ``async def``
    override: bool  # run_event instead of per-event methods
    events: frozenset[Event]
    blocking: frozenset[Event]
    delay_ms: int | None  # None: never suspends/sleeps; 0: a bare checkpoint
    every: int  # the delay applies to every n-th call
    logs: frozenset[Event] = frozenset()  # its handlers of these events log a record
    destination: bool = False  # a LoggerDestination (it receives every record)
    async_events: frozenset[Event] | None = None  # destinations: these handlers are async
    record_async: bool = False  # destinations: ``async def log_metrics``
    record_delay_ms: int | None = None  # destinations: as delay_ms, for every record

    def handler_is_async(self, event: Event) -> bool:
        """Whether the handler of ``event`` is a coroutine function."""
        if self.async_events is None or self.override:
            return self.is_async
        return event in self.async_events


@st.composite
def specs(draw: st.DrawFn, *, logging: bool = False) -> Spec:
    """A random callback; with ``logging`` some of its handlers log a record."""
    override = draw(st.booleans())
    if override:
        events = frozenset(TYPES)
        marked = events if draw(st.integers(0, 3)) == 0 else frozenset()
    else:
        events = draw(st.frozensets(st.sampled_from(TYPES), min_size=1))
        marked = draw(st.frozensets(st.sampled_from(sorted(events)), max_size=2))
    spec = Spec(
        is_async=draw(st.booleans()),
        override=override,
        events=events,
        blocking=marked,
        delay_ms=draw(st.sampled_from([None, 0, 1, 2])),
        every=draw(st.integers(1, 3)),
    )
    if not logging:
        return spec
    logs = draw(st.frozensets(st.sampled_from(sorted(events))))
    return dataclasses.replace(spec, logs=logs)


@st.composite
def dest_specs(draw: st.DrawFn) -> Spec:
    """A random destination: sync, async and ``@blocking`` event handlers, mixed freely,
    with a sync or async ``log_metrics`` (issue 11, defect 1 hid in that mix)."""
    override = draw(st.integers(0, 4)) == 0
    if override:
        events = frozenset(TYPES)
        marked = events if draw(st.booleans()) else frozenset()
        async_events: frozenset[Event] = frozenset()
    else:
        events = draw(st.frozensets(st.sampled_from(TYPES)))  # may handle records only
        ordered = sorted(events)
        marked = draw(st.frozensets(st.sampled_from(ordered), max_size=3)) if ordered else events
        async_events = draw(st.frozensets(st.sampled_from(ordered))) if ordered else events
    return Spec(
        is_async=draw(st.booleans()),
        override=override,
        events=events,
        blocking=marked,
        delay_ms=draw(st.sampled_from([None, 0, 1, 2])),
        every=draw(st.integers(1, 3)),
        destination=True,
        async_events=async_events,
        record_async=draw(st.booleans()),
        record_delay_ms=draw(st.sampled_from([None, 0, 1, 2, 2])),
    )


class Probe(Callback):
    """Stamps each call ``[seq, start, end]``; raises :class:`Boom` at call ``fail_at``.

    A handler of an event in ``spec.logs`` logs the record ``{"src": index, "k": k}``
    (its k-th) and keeps ``(k, stamp before, stamp after)`` in ``logged``.
    """

    def __init__(
        self, index: int, spec: Spec, stamp: itertools.count[int], fail_at: int | None
    ) -> None:
        self.index = index
        self.spec = spec
        self.stamp = stamp
        self.fail_at = fail_at
        self.calls: list[list[int]] = []
        self.closes: list[tuple[int, int]] = []
        self.post_closes: list[int] = []
        self.logged: list[tuple[int, int, int]] = []

    def _delay(self, n: int) -> float | None:
        delay = self.spec.delay_ms
        if delay is None or n % self.spec.every:
            return None
        return delay / 1000

    def _begin(self, state: Any, logger: Any, event: Event) -> tuple[list[int], float | None]:
        rec = [int(state.batch), next(self.stamp), -1]
        self.calls.append(rec)
        if self.fail_at == len(self.calls) - 1:
            rec[2] = next(self.stamp)
            raise Boom(type(self).__name__)
        if event in self.spec.logs:
            k = len(self.logged)
            before = next(self.stamp)
            logger.log_metrics({"src": self.index, "k": k}, step=k)
            self.logged.append((k, before, next(self.stamp)))
        return rec, self._delay(len(self.calls))

    def handle(self, state: Any, logger: Any, event: Event) -> None:
        rec, delay = self._begin(state, logger, event)
        try:
            if delay:
                time.sleep(delay)
        finally:
            rec[2] = next(self.stamp)

    async def ahandle(self, state: Any, logger: Any, event: Event) -> None:
        rec, delay = self._begin(state, logger, event)
        try:
            if delay is not None:
                await anyio.sleep(0)  # suspend before sleep() opens a cancel scope (trio)
                if delay:
                    await anyio.sleep(delay)
        finally:
            rec[2] = next(self.stamp)


class DestProbe(Probe, LoggerDestination):
    """A Probe that is also a destination: stamps each record ``[src, k, start, end]``.

    Raises :class:`Boom` at its record ``fail_record_at`` (counted from 0).
    """

    def __init__(
        self, index: int, spec: Spec, stamp: itertools.count[int], fail_at: int | None
    ) -> None:
        super().__init__(index, spec, stamp, fail_at)
        self.records: list[list[int]] = []
        self.fail_record_at: int | None = None

    def _begin_record(self, metrics: dict[str, Any]) -> tuple[list[int], float | None]:
        rec = [int(metrics["src"]), int(metrics["k"]), next(self.stamp), -1]
        self.records.append(rec)
        if self.fail_record_at == len(self.records) - 1:
            rec[3] = next(self.stamp)
            raise Boom(type(self).__name__)
        delay = self.spec.record_delay_ms
        return rec, None if delay is None else delay / 1000

    def record(self, metrics: dict[str, Any]) -> None:
        rec, delay = self._begin_record(metrics)
        try:
            if delay:
                time.sleep(delay)
        finally:
            rec[3] = next(self.stamp)

    async def arecord(self, metrics: dict[str, Any]) -> None:
        rec, delay = self._begin_record(metrics)
        try:
            if delay is not None:
                await anyio.sleep(0)
                if delay:
                    await anyio.sleep(delay)
        finally:
            rec[3] = next(self.stamp)


def _event_handler(event: Event, is_async: bool) -> Any:
    if is_async:

        async def coro(self: Probe, state: Any, logger: Any) -> None:
            await self.ahandle(state, logger, event)

        return coro

    def plain(self: Probe, state: Any, logger: Any) -> None:
        self.handle(state, logger, event)

    return plain


def probe_class(index: int, spec: Spec) -> type[Probe]:
    """A Probe subclass with fresh handler functions (``@blocking`` marks functions)."""
    ns: dict[str, Any] = {}
    if spec.override:
        if spec.is_async:

            async def run_event(self: Probe, event: Event, state: Any, logger: Any) -> None:
                await self.ahandle(state, logger, event)

        else:

            def run_event(self: Probe, event: Event, state: Any, logger: Any) -> None:
                self.handle(state, logger, event)

        ns["run_event"] = blocking(run_event) if spec.blocking else run_event
    else:
        for event in spec.events:
            fn = _event_handler(event, spec.handler_is_async(event))
            ns[event.value] = blocking(fn) if event in spec.blocking else fn

    if spec.destination:
        if spec.record_async:

            async def log_metrics(self: DestProbe, metrics: dict[str, Any], step: int) -> None:
                await self.arecord(metrics)

        else:

            def log_metrics(self: DestProbe, metrics: dict[str, Any], step: int) -> None:
                self.record(metrics)

        ns["log_metrics"] = log_metrics

    if spec.is_async:

        async def close(self: Probe, state: Any, logger: Any) -> None:
            start = next(self.stamp)
            await anyio.sleep(0)
            self.closes.append((start, next(self.stamp)))

        async def post_close(self: Probe) -> None:
            self.post_closes.append(next(self.stamp))
            await anyio.sleep(0)

    else:

        def close(self: Probe, state: Any, logger: Any) -> None:
            start = next(self.stamp)
            self.closes.append((start, next(self.stamp)))

        def post_close(self: Probe) -> None:
            self.post_closes.append(next(self.stamp))

    ns["close"], ns["post_close"] = close, post_close
    base = DestProbe if spec.destination else Probe
    return type(f"{'Dest' if spec.destination else 'Probe'}{index}", (base,), ns)
