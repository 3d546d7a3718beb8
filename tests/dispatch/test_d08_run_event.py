"""D8 run_event override: it gets every event; per-event methods are not called."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.dispatch._probes import Closes, batch_of, expected, fit
from tests.helpers import make_trainer
from trainbus import Event

pytestmark = pytest.mark.anyio


async def test_d8_run_event_override_gets_every_event_and_no_per_event_method() -> None:
    class Base(Closes):
        def __init__(self) -> None:
            super().__init__()
            self.events: list[tuple[Event, int]] = []
            self.direct = 0

        def batch_end(self, state: Any, logger: Any) -> None:
            self.direct += 1

        async def after_forward(self, state: Any, logger: Any) -> None:
            self.direct += 1

    class SyncOverride(Base):
        def run_event(self, event: Event, state: Any, logger: Any) -> None:
            self.events.append((event, batch_of(state)))

    class AsyncOverride(Base):
        async def run_event(self, event: Event, state: Any, logger: Any) -> None:
            await anyio.sleep(0)
            self.events.append((event, batch_of(state)))

    cbs = [SyncOverride(), AsyncOverride()]
    await fit(make_trainer(2, 2, cbs, eval_batches=1))
    for cb in cbs:
        assert cb.events == expected(2, 2, eval_batches=1), type(cb).__name__
        assert cb.direct == 0
        assert (cb.closed, cb.post_closed) == (1, 1)
