"""D1 per-callback order: each callback sees every event once, in order, one at a time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from tests.dispatch._probes import batch_of, expected, fit
from tests.helpers import make_trainer
from trainbus import Callback, Event

pytestmark = pytest.mark.anyio


class OrderProbe(Callback):
    """Records each call and how many of its handlers ever ran at once."""

    def __init__(self) -> None:
        self.events: list[tuple[Event, int]] = []
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def enter(self, event: Event, state: Any) -> int:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        self.events.append((event, batch_of(state)))
        return len(self.events)

    def leave(self) -> None:
        with self._lock:
            self.active -= 1


def _sync_handler(event: Event) -> Callable[..., None]:
    def handler(self: OrderProbe, state: Any, logger: Any) -> None:
        n = self.enter(event, state)
        try:
            if n % 7 == 3:  # now and then slow: later items queue behind it on its lane
                time.sleep(0.001)
        finally:
            self.leave()

    return handler


def _async_handler(event: Event) -> Callable[..., Any]:
    async def handler(self: OrderProbe, state: Any, logger: Any) -> None:
        n = self.enter(event, state)
        try:
            await anyio.sleep(0)  # a lane that ran two handlers at once would interleave here
            if n % 5 == 2:
                await anyio.sleep(0.001)
        finally:
            self.leave()

    return handler


def probe_class(kind: str) -> type[OrderProbe]:
    """An OrderProbe with a ``kind`` ('sync', 'async', 'mixed') method for every event."""
    ns: dict[str, Any] = {}
    for i, event in enumerate(Event):
        is_async = kind == "async" or (kind == "mixed" and i % 2 == 1)
        ns[event.value] = _async_handler(event) if is_async else _sync_handler(event)
    return type(f"{kind.title()}Probe", (OrderProbe,), ns)


@pytest.mark.parametrize(
    "config",
    [{}, {"barriers": ()}, {"max_lag": 2}, {"barriers": (), "queue_size": 2}],
    ids=["default", "no-barriers", "max-lag-2", "queue-2"],
)
async def test_d1_each_callback_sees_every_event_once_in_order_one_at_a_time(
    config: dict[str, Any],
) -> None:
    probes = [probe_class(kind)() for kind in ("sync", "async", "mixed")]
    trainer = make_trainer(3, 2, probes, eval_batches=1, **config)
    await fit(trainer)
    want = expected(3, 2, eval_batches=1)
    for probe in probes:
        assert probe.events == want, type(probe).__name__
        assert probe.max_active == 1, f"{type(probe).__name__} ran handlers concurrently"
        assert probe.active == 0
