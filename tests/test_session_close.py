"""A callback nothing is ever queued for has nothing to drain at close.

Its handlers are all plain ``@blocking`` ones: they run on the training thread, so its
worker on the loop never holds an item. A rule of the declarations (D7), never of what is
queued now.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.dispatch._probes import batch_of
from tests.helpers import make_trainer
from trainbus import Callback, blocking
from trainbus.bus import watchdog


@pytest.mark.parametrize("queued", [False, True])
def test_a_callback_with_only_plain_blocking_handlers_has_nothing_to_drain(
    queued: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its handlers run on the training thread, so its worker on the loop never holds an
    item: no batch wakes the loop for it, and the close's drains skip it (no bounded wait,
    so no watch thread: a fit's fixed cost that depended on thread timing). A callback
    with a queued handler is still drained under the watch."""
    watched: list[str] = []
    start = watchdog.start_thread

    def spy(thread: Any, **kw: Any) -> Any:
        watched.append(thread.name)
        return start(thread, **kw)

    monkeypatch.setattr(watchdog, "start_thread", spy)
    seen: list[tuple[str, int]] = []

    class OnlyBlocking(Callback):
        @blocking
        def fit_start(self, state: Any, logger: Any) -> None:
            seen.append(("fit_start", batch_of(state)))

        @blocking
        def batch_end(self, state: Any, logger: Any) -> None:
            seen.append(("batch_end", batch_of(state)))

    class Queued(Callback):
        async def batch_end(self, state: Any, logger: Any) -> None:
            seen.append(("queued", batch_of(state)))

    trainer = make_trainer(3, callbacks=[OnlyBlocking(), *([Queued()] if queued else [])])
    trainer.fit_sync()

    blocking_calls = [("fit_start", 0), ("batch_end", 1), ("batch_end", 2), ("batch_end", 3)]
    assert [s for s in seen if s[0] != "queued"] == blocking_calls
    if queued:
        assert [s for s in seen if s[0] == "queued"] == [("queued", b) for b in (1, 2, 3)]
        assert watched and set(watched) == {"trainbus-loop-watch"}
        assert trainer.engine.statistics().loop_wakeups > 0
    else:
        assert watched == []
        assert trainer.engine.statistics().loop_wakeups == 0
