"""A fit's session has started its own tasks before the training thread runs.

``async def background`` runs "as a task for the whole fit(), started before the
``INIT``/``FIT_START`` handlers run" (``CONTRIBUTING.md``, ``docs/concurrency.md``): the
session starts each one (up to its first wait) before the training thread starts, on
asyncio and on trio, however busy the machine is. Before, the task was only scheduled, and
a ``@blocking`` ``fit_start`` on the training thread could run first.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.helpers import make_trainer
from trainbus import Callback, blocking

pytestmark = pytest.mark.anyio


class Sender(Callback):
    def __init__(self) -> None:
        self.started = False
        self.seen_at_fit_start: bool | None = None

    async def background(self, state: Any, logger: Any) -> None:
        self.started = True
        await anyio.sleep_forever()  # until the fit ends: cancelled after every close

    @blocking
    def fit_start(self, state: Any, logger: Any) -> None:  # on the training thread
        self.seen_at_fit_start = self.started


async def test_background_has_started_when_fit_start_runs() -> None:
    for _ in range(5):  # each fit is a session of its own
        sender = Sender()
        await make_trainer(1, callbacks=[sender]).fit()
        assert sender.seen_at_fit_start is True


class CancelsAtStart(Callback):
    """Cancels the scope around ``fit()`` from its ``background``'s first step: the caller
    is cancelled while the session is still starting."""

    def __init__(self, scope: anyio.CancelScope) -> None:
        self.scope = scope
        self.closed = 0

    async def background(self, state: Any, logger: Any) -> None:
        self.scope.cancel()
        await anyio.sleep_forever()

    def close(self, state: Any, logger: Any) -> None:
        self.closed += 1


async def test_a_fit_cancelled_while_its_session_starts_closes_and_is_cancelled() -> None:
    with anyio.fail_after(60):  # a hang guard only: the fit returns at once when it works
        with anyio.CancelScope() as scope:
            callback = CancelsAtStart(scope)
            await make_trainer(3, callbacks=[callback]).fit()
    assert scope.cancelled_caught
    assert callback.closed == 1
